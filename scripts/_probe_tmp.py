import subprocess, sys, os
lib = sys.argv[1] if len(sys.argv) > 1 else None
load = f"import torch; torch.ops.load_library({lib!r}); " if lib else "import torch, make_inplace; "
cases = {
 "sm_cpu": "x=torch.randn(5,4); torch.ops.make_inplace.square_matmul_(x, torch.randn(3,3))",
 "sm_cuda": "x=torch.randn(5,4,device='cuda'); torch.ops.make_inplace.square_matmul_(x, torch.randn(3,3,device='cuda'))",
 "ln_cuda": "x=torch.randn(4,6,device='cuda'); torch.ops.make_inplace.layer_norm_(x,[5])",
}
for k, c in cases.items():
    r = subprocess.run([sys.executable, "-c", load + c], capture_output=True, text=True)
    print(k, r.returncode, (r.stderr.strip().splitlines() or [""])[-1][:200], flush=True)
