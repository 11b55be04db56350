"""spconv 2.3.8's side of benchmarks/site_conv_gpu.py (PyTorch; run on the lent GPU after
`site_conv_gpu.py --phase ours`, which wrote the sites and reference rows it checks).

Same scenes, layers, features and weights (benchmarks/site_scenes.py; features follow
sorted coordinates in both processes). Before timing, every layer's fp32 output is
compared with ours at the reference sites; the kernel orientation that matches is
recorded. Also measures the GPU's matrix rate (cuBLAS; TF32 only in the --tf32 run) and
copy bandwidth for the floor. Writes <exchange>/spconv.json (spconv_tf32.json with --tf32).
"""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from site_scenes import CHAIN, LAYERS, layer_weights, level_features  # noqa: E402

# Set by load_spconv, after the arguments are read.
torch = spconv = ConvAlgo = None
ALLOW_TF32 = False
DTYPES = {}
RESULTS = "spconv.json"


def load_spconv(tf32):
    """Imports PyTorch and spconv. --tf32 is a run of its own: spconv's TF32 switch (off by
    default) must be set before its modules load; it times float32 as "tf32" against ours
    with TensorFlow's TF32 on."""
    global torch, spconv, ConvAlgo, ALLOW_TF32, DTYPES, RESULTS
    import torch as torch_module
    import spconv as spconv_core
    spconv_core.constants.SPCONV_ALLOW_TF32 = tf32
    import spconv.pytorch as spconv_pytorch
    from spconv.core import ConvAlgo as conv_algo
    torch, spconv, ConvAlgo, ALLOW_TF32 = torch_module, spconv_pytorch, conv_algo, tf32
    DTYPES = {"tf32": torch.float32} if tf32 else {"fp32": torch.float32, "fp16": torch.float16}
    RESULTS = "spconv_tf32.json" if tf32 else "spconv.json"


def sorted_order(coords):
    return np.lexsort(coords.T[::-1])


def timed(fn, warmup, reps, before=None):
    """(median wall s of the synchronised call, median CUDA-event s)."""
    for _ in range(warmup):
        if before:
            before()
        fn()
    torch.cuda.synchronize()
    walls, events = [], []
    for _ in range(reps):
        if before:
            before()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        walls.append(time.perf_counter() - t0)
        events.append(start.elapsed_time(end) / 1e3)
    return statistics.median(walls), statistics.median(events)


def rates():
    torch.backends.cuda.matmul.allow_tf32 = ALLOW_TF32
    out = {}
    for name, dt in DTYPES.items():
        a = torch.randn(8192, 8192, device="cuda", dtype=dt)
        b = torch.randn(8192, 8192, device="cuda", dtype=dt)
        _, t = timed(lambda: torch.matmul(a, b), 3, 10)
        out[f"matmul_{name}_flops"] = 2 * 8192 ** 3 / t
    x = torch.empty(1 << 28, device="cuda", dtype=torch.float32)  # 1 GiB
    y = torch.empty_like(x)
    _, t = timed(lambda: y.copy_(x), 3, 10)
    out["copy_bytes_per_s"] = 2 * x.numel() * 4 / t
    return out


def make_conv(kind, cin, cout, k, key, algo):
    if kind == "subm":
        return spconv.SubMConv3d(cin, cout, k, bias=False, indice_key=key, algo=algo)
    if kind == "down":
        return spconv.SparseConv3d(cin, cout, k, stride=2, bias=False, indice_key=key, algo=algo)
    return spconv.SparseInverseConv3d(cin, cout, k, bias=False, indice_key=key, algo=algo)


def set_weight(conv, w, flip):
    """Our [k, k, k, Cin, Cout] into spconv's layout (checked by shape), optionally with
    the kernel offsets reversed."""
    if flip:
        w = w[::-1, ::-1, ::-1]
    shape = tuple(conv.weight.shape)
    if shape == w.shape:
        value = w
    elif shape == (w.shape[4], *w.shape[:3], w.shape[3]):
        value = np.transpose(w, (4, 0, 1, 2, 3))
    elif shape == (*w.shape[:3], w.shape[4], w.shape[3]):
        value = np.transpose(w, (0, 1, 2, 4, 3))
    else:
        raise RuntimeError(f"unexpected spconv weight shape {shape} for ours {w.shape}")
    with torch.no_grad():
        conv.weight.copy_(torch.from_numpy(np.ascontiguousarray(value)))


def build_levels(levels, algo):
    """spconv tensors of levels 0..2 whose shared indice_dict holds every map of LAYERS."""
    coords0 = levels["coords0"]
    spatial = [int(s) for s in levels["spatial"]]
    batch = int(levels["batch"])
    x0 = spconv.SparseConvTensor(torch.zeros(len(coords0), 1, device="cuda"),
                                 torch.from_numpy(coords0).cuda(), spatial, batch)
    x0 = spconv.SubMConv3d(1, 1, 3, bias=False, indice_key="subm0", algo=algo).cuda()(x0)
    x1 = spconv.SparseConv3d(1, 1, 2, stride=2, bias=False, indice_key="down1", algo=algo).cuda()(x0)
    x1 = spconv.SubMConv3d(1, 1, 3, bias=False, indice_key="subm1", algo=algo).cuda()(x1)
    x2 = spconv.SparseConv3d(1, 1, 2, stride=2, bias=False, indice_key="down2", algo=algo).cuda()(x1)
    x2 = spconv.SubMConv3d(1, 1, 3, bias=False, indice_key="subm2", algo=algo).cuda()(x2)
    tensors = {0: x0, 1: x1, 2: x2}
    for lv in (1, 2):
        mine = tensors[lv].indices.cpu().numpy()
        ours = levels[f"coords{lv}"]
        if not np.array_equal(mine[sorted_order(mine)], ours[sorted_order(ours)]):
            raise RuntimeError(f"level {lv}: spconv has {len(mine)} sites, ours {len(ours)}; the sites differ")
    return tensors


def with_features(tensor, feats_sorted, dtype):
    """tensor's sites and maps, features given in sorted-coordinate order."""
    order = sorted_order(tensor.indices.cpu().numpy())
    feats = np.empty_like(feats_sorted)
    feats[order] = feats_sorted
    return tensor.replace_feature(torch.from_numpy(feats).cuda().to(dtype))


def rows_at(tensor, coords):
    index = {tuple(c): i for i, c in enumerate(tensor.indices.cpu().numpy())}
    rows = [index[tuple(c)] for c in coords]
    return tensor.features.detach().float().cpu().numpy()[rows]


def run(args):
    ours = json.load(open(os.path.join(args.exchange, "ours.json")))
    scenes = sorted({r["scene"] for r in ours["rows"] if r["pass"] != "overhead"})
    out_rows, measured = [], rates()
    print("[spconv] rates:", {k: f"{v:.3g}" for k, v in measured.items()}, flush=True)
    algos = {"native": ConvAlgo.Native, "mask_implicit_gemm": ConvAlgo.MaskImplicitGemm}
    for scene in scenes:
        levels = dict(np.load(os.path.join(args.exchange, f"{scene}_levels.npz")))
        reference = dict(np.load(os.path.join(args.exchange, f"{scene}_reference.npz")))
        print(f"[spconv] {scene}: {len(levels['coords0']):,} sites", flush=True)
        for algo_name, algo in algos.items():
            tensors = build_levels(levels, algo)
            flips = {}
            for li, (name, kind, level, cin, cout, k, stride, key) in enumerate(LAYERS):
                feats = level_features(len(levels[f"coords{level}"]), cin, seed=1000 + li)
                w = layer_weights(cin, cout, k, seed=2000 + li)
                for dtype_name in args.dtypes:
                    dt = DTYPES[dtype_name]
                    conv = make_conv(kind, cin, cout, k, key, algo).cuda().to(dt)
                    x = with_features(tensors[level], feats, dt)
                    if dtype_name in ("fp32", "tf32"):  # whichever float32 run this is
                        errors = {}
                        for candidate in (False, True):
                            set_weight(conv, w, candidate)
                            got = rows_at(conv(x), reference[f"{name}_coords"])
                            want = reference[f"{name}_out"]
                            errors[candidate] = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
                        flips[name] = flip = min(errors, key=errors.get)
                        max_rel_err = errors[flip]
                        if max_rel_err > (1e-2 if dtype_name == "tf32" else 1e-3):
                            raise RuntimeError(f"{scene} {name} ({algo_name}): spconv and ours differ, "
                                               f"max relative error {errors}")
                    else:
                        flip = flips[name]
                        set_weight(conv, w, flip)
                    fwd_s, fwd_gpu = timed(lambda: conv(x), args.warmup, args.reps)
                    xg = x.replace_feature(x.features.clone().requires_grad_(True))
                    g = torch.from_numpy(np.random.default_rng(3000 + li).standard_normal(
                        (len(rows_of(conv, xg)), cout)).astype(np.float32)).cuda().to(dt)
                    state = {}

                    def forward():
                        state["y"] = conv(xg)

                    def backward():
                        torch.autograd.grad(state["y"].features, [xg.features, conv.weight], g)
                    bwd_s, bwd_gpu = timed(backward, args.warmup, args.reps, before=forward)
                    for pass_name, s, gpu in (("fwd", fwd_s, fwd_gpu), ("bwd", bwd_s, bwd_gpu)):
                        out_rows.append({"scene": scene, "layer": name, "pass": pass_name, "dtype": dtype_name,
                                         "algo": algo_name, "spconv_s": s, "spconv_gpu_s": gpu,
                                         "max_rel_err": max_rel_err if dtype_name in ("fp32", "tf32") else None,
                                         "kernel_flipped": flip})
                    print(f"  {algo_name:<18} {name:<18} {dtype_name} fwd {fwd_s * 1e3:7.3f} ms "
                          f"bwd {bwd_s * 1e3:7.3f} ms (err {max_rel_err:.1e}, flip {flip})", flush=True)
            out_rows += chain(scene, tensors, levels, flips, algo, algo_name, args)
            save(args, measured, out_rows)  # after every scene and algorithm: partial runs count


def save(args, measured, out_rows):
    best = {}
    for r in out_rows:  # spconv's faster algorithm per configuration
        key = (r["scene"], r["layer"], r["pass"], r["dtype"])
        if key not in best or r["spconv_s"] < best[key]["spconv_s"]:
            best[key] = r
    with open(os.path.join(args.exchange, RESULTS), "w") as f:
        json.dump({"rates": measured, "rows": list(best.values()), "all_algos": out_rows}, f)
    print(f"[spconv] {len(best)} configurations -> {args.exchange}/{RESULTS}", flush=True)


def rows_of(conv, x):
    with torch.no_grad():
        return conv(x).features


def chain(scene, tensors, levels, flips, algo, algo_name, args):
    spec = {name: (kind, level, cin, cout, k, key, li) for li, (name, kind, level, cin, cout, k, _, key)
            in enumerate(LAYERS)}
    rows = []
    for dtype_name in args.dtypes:
        dt = DTYPES[dtype_name]
        convs = []
        for n in CHAIN:
            kind, level, cin, cout, k, key, li = spec[n]
            conv = make_conv(kind, cin, cout, k, key, algo).cuda().to(dt)
            set_weight(conv, layer_weights(cin, cout, k, seed=2000 + li), flips[n])
            convs.append(conv)
        first = spec[CHAIN[0]]
        x = with_features(tensors[first[1]], level_features(len(levels["coords0"]), first[2], seed=1000 + first[6]),
                          dt)

        def forward(x=x, convs=convs):
            for conv in convs:
                x = conv(x)
            return x

        def forward_backward(x=x):
            xg = x.replace_feature(x.features.clone().requires_grad_(True))
            y = forward(xg)
            y.features.float().sum().backward()

        for pass_name, fn in (("fwd", forward), ("fwd_bwd", forward_backward)):
            s, gpu = timed(fn, args.warmup, args.reps)
            rows.append({"scene": scene, "layer": "end_to_end", "pass": pass_name, "dtype": dtype_name,
                         "algo": algo_name, "spconv_s": s, "spconv_gpu_s": gpu, "max_rel_err": None,
                         "kernel_flipped": None})
            print(f"  {algo_name:<18} end_to_end {dtype_name} {pass_name}: {s * 1e3:.3f} ms", flush=True)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--exchange", default="/tmp/site_bench")
    p.add_argument("--dtypes", nargs="*", default=None, help="fp32 fp16 (default), or tf32 with --tf32")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--tf32", action="store_true", help="spconv with SPCONV_ALLOW_TF32, float32 timed as 'tf32'")
    args = p.parse_args()
    load_spconv(args.tf32)
    if args.dtypes is None:
        args.dtypes = list(DTYPES)
    run(args)


if __name__ == "__main__":
    main()
