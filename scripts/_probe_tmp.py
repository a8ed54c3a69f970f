import subprocess, sys
cases = {
 "sm": "import torch,make_inplace as m; x=torch.randn(5,4,device='cuda'); m.square_matmul_(x, torch.randn(3,3,device='cuda'))",
 "ln": "import torch,make_inplace as m; x=torch.randn(4,6,device='cuda'); torch.ops.make_inplace.layer_norm_(x,[5])",
 "sf": "import torch,make_inplace as m; x=torch.randn(4,6,device='cuda'); m.softmax_(x, dim=5)",
 "op": "import torch,make_inplace as m; m.outer_product(torch.randn(2,3,device='cuda'), torch.randn(3,3,device='cuda'))",
 "plain": "import torch; torch.ops.load_library; import make_inplace; torch.zeros(2,device='cuda').view(3)",
}
for k, c in cases.items():
    r = subprocess.run([sys.executable, "-c", c], capture_output=True, text=True)
    print(k, r.returncode, (r.stderr.strip().splitlines() or [""])[-1][:200])
