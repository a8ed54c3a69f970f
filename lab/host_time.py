"""Host time of one eager call per op: through the eager entry points and
through torch.ops (the entry switched off), against torch's own call.

    python lab/host_time.py --device cuda [--models]

--models adds converted Hugging Face models (random weights, batch 1, 32
tokens, float16 on CUDA): one synchronized forward with the entries on and
off, and the unconverted model.

On CUDA this is the launch-side time (no synchronize inside the loop), which
is what a small model's step is made of. Medians of alternated rounds, in us.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import time

import torch
import torch.nn.functional as F

import make_inplace

# The op modules (make_inplace.ops re-exports functions of the same names).
layer_norm, outer_product, rms_norm, softmax, square_matmul, trilinear = (
    importlib.import_module(f"make_inplace.ops.{name}")
    for name in ("layer_norm", "outer_product", "rms_norm", "softmax", "square_matmul", "trilinear")
)


def per_call_us(fn, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def cases(device: str):
    x = torch.randn(8, 64, device=device)
    w = torch.linalg.qr(torch.randn(64, 64))[0].to(device)
    g, b = torch.randn(64, device=device), torch.randn(64, device=device)
    # rms_norm_ applied over and over scales element j by (g[j] / rms(g))^k:
    # a weight of +-1 keeps x normal (a random one drives it into subnormals,
    # which cost 3x on the CPU, for torch's reference reading x as well).
    unit = torch.randn(64, device=device).sign()
    a, c = torch.randn(4, 16, device=device), torch.randn(4, 16, device=device)
    out = torch.empty(4, 16, 16, device=device)
    feats, points, tri_out = torch.randn(32, 8, 4, device=device), torch.rand(32, 3, device=device), torch.empty(32, 4, device=device)
    return [
        ("square_matmul_ (8, 64)", square_matmul, lambda: make_inplace.square_matmul_(x, w), lambda: torch.matmul(x, w)),
        ("softmax_ (8, 64)", softmax, lambda: make_inplace.softmax_(x, -1), lambda: torch.softmax(x, -1)),
        ("layer_norm_ (8, 64)", layer_norm, lambda: make_inplace.layer_norm_(x, 64, g, b), lambda: F.layer_norm(x, (64,), g, b)),
        ("rms_norm_ (8, 64)", rms_norm, lambda: make_inplace.rms_norm_(x, 64, unit), lambda: F.rms_norm(x, (64,), unit)),
        ("outer_product out= (4, 16, 16)", outer_product, lambda: make_inplace.outer_product(a, c, out=out),
         lambda: torch.mul(a[..., :, None], c[..., None, :], out=out)),
        ("trilinear out= (32, 4)", trilinear, lambda: make_inplace.trilinear_interpolation(feats, points, out=tri_out),
         None),
    ]


MODULES = (layer_norm, outer_product, rms_norm, softmax, square_matmul, trilinear)


def model_rows(device: str, rounds: int) -> None:
    import copy

    import transformers as tf

    dtype = torch.float16 if device == "cuda" else torch.float32
    configs = {
        "BERT-base": lambda: tf.BertModel(tf.BertConfig(attn_implementation="sdpa")),
        "GPT-2 small": lambda: tf.GPT2Model(tf.GPT2Config(attn_implementation="sdpa")),
        "Llama 8 x 1024": lambda: tf.LlamaModel(tf.LlamaConfig(
            hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
            num_key_value_heads=4, attn_implementation="sdpa")),
    }
    entries = {m: m._eager for m in MODULES}
    print(f"{'model (batch 1, 32 tokens), ms':34s} {'entry':>7s} {'torch.ops':>10s} {'torch':>7s}")
    for name, build in configs.items():
        torch.manual_seed(0)
        plain = build().to(device, dtype).eval()
        converted = make_inplace.convert_(copy.deepcopy(plain))
        ids = torch.randint(0, 1000, (1, 32), device=device)

        def forward(model):
            with torch.inference_mode():
                model(input_ids=ids)
            if device == "cuda":
                torch.cuda.synchronize()

        times = {"entry": [], "ops": [], "torch": []}
        for r in range(rounds):
            # The order turns each round, and each block starts with an
            # untimed call: the allocator's state after the previous block
            # must not land on one side.
            order = [("entry", True), ("ops", False), ("torch", None)]
            for key, on in order[r % 3:] + order[: r % 3]:
                for m in MODULES:
                    m._eager = entries[m] if on else None
                model = plain if on is None else converted
                forward(model)
                times[key].append(per_call_us(lambda: forward(model), 20) / 1e3)
        for m in MODULES:
            m._eager = entries[m]
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{name:34s} {med['entry']:7.2f} {med['ops']:10.2f} {med['torch']:7.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--models", action="store_true", help="also converted Hugging Face models")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, device {args.device}, us per call (median of {args.rounds} rounds)")
    print(f"{'op':34s} {'entry':>7s} {'torch.ops':>10s} {'torch':>7s}")
    for name, module, ours, theirs in cases(args.device):
        entry = module._eager
        times = {"entry": [], "ops": [], "torch": []}
        for _ in range(args.rounds):
            module._eager = entry
            times["entry"].append(per_call_us(ours, args.calls))
            module._eager = None
            times["ops"].append(per_call_us(ours, args.calls))
            if theirs is not None:
                times["torch"].append(per_call_us(theirs, args.calls))
            if args.device == "cuda":
                torch.cuda.synchronize()
        module._eager = entry
        med = {k: statistics.median(v) if v else float("nan") for k, v in times.items()}
        print(f"{name:34s} {med['entry']:7.2f} {med['ops']:10.2f} {med['torch']:7.2f}")
    if args.models:
        model_rows(args.device, args.rounds)


if __name__ == "__main__":
    main()
