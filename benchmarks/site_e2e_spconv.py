"""spconv 2.3.8's side of benchmarks/site_e2e_gpu.py (PyTorch; run on the lent GPU after
`site_e2e_gpu.py --phase ours`, which wrote the exchange this reads).

The same networks (site_networks.py) with the same weights and batch-norm statistics, on
the same sites and features. Before timing, each network's fp32 inference output and the
gradients of its weights (training mode) are compared with ours; the kernel orientation
of each kind of convolution (submanifold, strided, inverse) is the one of the eight that
matches. Every call builds a fresh SparseConvTensor, so spconv builds its kernel maps
(indice pairs) inside the call, as ours does. Writes <exchange>/spconv.json.
"""
import argparse
import itertools
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import site_conv_spconv as per_layer  # noqa: E402  (its spconv loader, timer and weight layout)
from gpu_trace import append_kernel_row, rank_events  # noqa: E402
from site_networks import (BN_EPS, SITE_HASH, SITE_HASH_MOD, conv_kinds, conv_weights,  # noqa: E402
                           loss_channel_weights, network, relative, sorted_rows)

torch = spconv = ConvAlgo = None
KINDS = ("subm", "down", "inv")


def load_spconv():
    """spconv without TF32 (site_conv_spconv's loader), and PyTorch's own TF32 off too."""
    global torch, spconv, ConvAlgo
    per_layer.load_spconv(tf32=False)
    torch, spconv, ConvAlgo = per_layer.torch, per_layer.spconv, per_layer.ConvAlgo
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


class Network:
    """The steps of site_networks as spconv modules, interpreted in order."""

    def __init__(self, steps, algo, dtype):
        self.steps = steps
        self.convs, self.norms = {}, {}
        for step in steps:
            if step[0] == "conv":
                _, name, _, kind, cin, cout, k, key = step
                if kind == "subm":
                    conv = spconv.SubMConv3d(cin, cout, k, bias=False, indice_key=key, algo=algo)
                elif kind == "down":
                    conv = spconv.SparseConv3d(cin, cout, k, stride=2, bias=False, indice_key=key, algo=algo)
                else:
                    conv = spconv.SparseInverseConv3d(cin, cout, k, bias=False, indice_key=key, algo=algo)
                self.convs[name] = conv.cuda().to(dtype)
            elif step[0] == "bn":
                # parameters and statistics in float32, as ours (mixed_float16) keeps them
                self.norms[step[1]] = torch.nn.BatchNorm1d(step[3], eps=BN_EPS, momentum=1.0).cuda()

    def parameters(self):
        return [m.weight for m in self.convs.values()] + [p for n in self.norms.values() for p in n.parameters()]

    def train(self, mode):
        for n in self.norms.values():
            n.train(mode)

    def __call__(self, x, every=False):
        """The last step's tensor, or with every=True the dict of every step's."""
        t = {"x": x}
        for step in self.steps:
            op, out = step[0], step[1]
            if op == "conv":
                t[out] = self.convs[out](t[step[2]])
            elif op == "bn":
                src = t[step[2]]
                t[out] = src.replace_feature(self.norms[out](src.features.float()).to(src.features.dtype))
            elif op == "relu":
                t[out] = t[step[2]].replace_feature(torch.relu(t[step[2]].features))
            elif op == "add":
                t[out] = t[step[2]].replace_feature(t[step[2]].features + t[step[3]].features)
            elif op == "concat":
                t[out] = t[step[2]].replace_feature(torch.cat([t[step[2]].features, t[step[3]].features], 1))
        return t if every else t[self.steps[-1][1]]


def set_weight(conv, w, flip):
    """Our [k, k, k, Cin, Cout] into conv (site_conv_spconv.set_weight: spconv's layout, offsets
    reversed with flip). A 1^3 kernel is our [Cin, Cout] matrix in row-major memory order
    whatever the shape says: spconv 2.3.8's 1x1 path (conv.py, `conv1x1`) multiplies the
    features by weight.view(Cin, Cout) in its default [Cout, 1, 1, 1, Cin] layout."""
    if w.shape[:3] != (1, 1, 1):
        per_layer.set_weight(conv, w, flip)
        return
    with torch.no_grad():
        conv.weight.copy_(torch.from_numpy(np.ascontiguousarray(w.reshape(tuple(conv.weight.shape)))))


def from_spconv_layout(conv, g, our_shape, flip):
    """The inverse of set_weight's layout for a gradient."""
    shape = tuple(conv.weight.shape)
    if our_shape[:3] == (1, 1, 1):
        return g.reshape(our_shape)
    if shape == our_shape:
        w = g
    elif shape == (our_shape[4], *our_shape[:3], our_shape[3]):
        w = np.transpose(g, (1, 2, 3, 4, 0))
    else:
        w = np.transpose(g, (0, 1, 2, 4, 3))
    return w[::-1, ::-1, ::-1] if flip else w


def set_weights(net, steps, weights, flips):
    kinds = conv_kinds(steps)
    for name, conv in net.convs.items():
        set_weight(conv, weights[name], flips[kinds[name]])


def training_loss(y):
    """site_networks' loss of output tensor y (SITE_HASH)."""
    h = (y.indices.long() * torch.tensor(SITE_HASH, device=y.indices.device)).sum(1) % SITE_HASH_MOD
    s = h.float() / SITE_HASH_MOD - 0.5
    u = torch.from_numpy(loss_channel_weights(y.features.shape[1])).to(y.features.device)
    return (s * (y.features.float() @ u)).mean()


def probe_errors(net, x, reference):
    """{convolution: relative difference of its output from ours (inference mode)} at the
    rows the reference kept (the first in coordinate order), in the network's order."""
    with torch.no_grad():
        t = net(x, every=True)
    errs = {}
    for name in net.convs:
        want_coords, want = reference[f"probe_{name}_coords"], reference[f"probe_{name}_features"]
        got_coords, got = sorted_rows(t[name].indices.cpu().numpy(), t[name].features.float().cpu().numpy(),
                                      len(want_coords))
        errs[name] = relative(got, want) if np.array_equal(got_coords, want_coords) else float("inf")
    return errs


def run(args):
    load_spconv()
    ours = json.load(open(os.path.join(args.exchange, "ours.json")))
    runs = sorted({r["network"] for r in ours["rows"]}, key=[r["network"] for r in ours["rows"]].index)
    dtypes = sorted({r["dtype"] for r in ours["rows"]}, key=["fp32", "fp16"].index)
    rows, errors, first_parted = [], {}, {}
    algos = {"native": ConvAlgo.Native, "mask_implicit_gemm": ConvAlgo.MaskImplicitGemm}
    for run_name in runs:
        inputs = dict(np.load(os.path.join(args.exchange, f"{run_name}_inputs.npz")))
        reference = dict(np.load(os.path.join(args.exchange, f"{run_name}_reference.npz")))
        bn = dict(np.load(os.path.join(args.exchange, f"{run_name}_bn.npz")))
        net_name = run_name.split("_")[0]
        steps = network(net_name)
        kinds = conv_kinds(steps)
        weights = conv_weights(net_name, steps)
        coords = torch.from_numpy(inputs["coords"]).cuda()
        spatial = [int(s) for s in inputs["spatial"]]
        batch = int(inputs["batch"])
        features32 = torch.from_numpy(inputs["features"]).cuda()
        want_coords, want = sorted_rows(reference["out_coords"], reference["out_features"])
        print(f"[spconv] {run_name}: {len(inputs['coords']):,} sites", flush=True)
        flips = None
        for algo_name, algo in algos.items():
            for dtype_name in dtypes:
                dt = {"fp32": torch.float32, "fp16": torch.float16}[dtype_name]
                net = Network(steps, algo, dt)
                for name, norm in net.norms.items():
                    with torch.no_grad():
                        norm.running_mean.copy_(torch.from_numpy(bn[f"{name}_mean"]))
                        norm.running_var.copy_(torch.from_numpy(bn[f"{name}_var"]))
                features = features32.to(dt)

                def forward():
                    with torch.no_grad():
                        return net(spconv.SparseConvTensor(features, coords, spatial, batch))

                if flips is None:  # fp32, first algorithm: which orientation is ours
                    net.train(False)
                    errs = {}
                    for combo in itertools.product((False, True), repeat=len(KINDS)):
                        candidate = dict(zip(KINDS, combo))
                        set_weights(net, steps, weights, candidate)
                        y = forward()
                        got_coords, got = sorted_rows(y.indices.cpu().numpy(), y.features.float().cpu().numpy())
                        if not np.array_equal(got_coords, want_coords):
                            raise RuntimeError(f"{run_name}: spconv's output sites differ from ours "
                                               f"({len(got_coords)} against {len(want_coords)})")
                        errs[combo] = relative(got, want)
                    if args.every_orientation:
                        for combo in errs:
                            set_weights(net, steps, weights, dict(zip(KINDS, combo)))
                            e = probe_errors(net, spconv.SparseConvTensor(features, coords, spatial, batch),
                                             reference)
                            parted = [name for name, v in e.items() if v > args.tolerance]
                            print(f"  orientation {combo}: output {errs[combo]:.1e}; first beyond tolerance "
                                  + ", ".join(f"{n} {e[n]:.1e}" for n in parted[:4]), flush=True)
                    best = min(errs, key=errs.get)
                    flips = dict(zip(KINDS, best))
                    out_err = errs[best]
                    set_weights(net, steps, weights, flips)
                    probe_errs = probe_errors(net, spconv.SparseConvTensor(features, coords, spatial, batch),
                                              reference)
                    parted = [name for name, e in probe_errs.items() if e > args.tolerance]
                    print(f"  every convolution's output against ours: largest {max(probe_errs.values()):.1e}"
                          + (f"; beyond {args.tolerance} from {parted[0]} on ({len(parted)} of "
                             f"{len(probe_errs)}: {parted[:6]})" if parted else ""), flush=True)
                    # Gradients in training mode against ours.
                    set_weights(net, steps, weights, flips)
                    net.train(True)
                    loss = training_loss(net(spconv.SparseConvTensor(features, coords, spatial, batch)))
                    loss.backward()
                    grad_err = 0.0
                    for name, conv in net.convs.items():
                        g = from_spconv_layout(conv, conv.weight.grad.float().cpu().numpy(), weights[name].shape,
                                               flips[kinds[name]])
                        grad_err = max(grad_err, relative(g, reference[f"grad_{name}"]))
                    loss_err = abs(loss.item() - float(reference["loss"])) / max(abs(float(reference["loss"])), 1e-30)
                    errors[run_name] = {"output": out_err, "loss": loss_err, "gradients": grad_err}
                    first_parted[run_name] = parted[0] if parted else None
                    print(f"  orientation {flips}: output {out_err:.1e}, weight gradients {grad_err:.1e}, "
                          f"loss {loss_err:.1e} (relative to ours)", flush=True)
                    if (max(out_err, loss_err) > args.tolerance or grad_err > args.grad_tolerance) and \
                            not args.record_mismatch:
                        raise RuntimeError(f"{run_name}: spconv and ours differ beyond {args.tolerance} "
                                           f"(output {out_err:.2e}, gradients {grad_err:.2e}, loss {loss_err:.2e}; "
                                           f"orientations tried: {errs})")
                else:
                    set_weights(net, steps, weights, flips)
                params = net.parameters()

                def train_step():
                    for p in params:
                        p.grad = None
                    training_loss(net(spconv.SparseConvTensor(features, coords, spatial, batch))).backward()

                for pass_name, fn, mode in (("fwd", forward, False), ("train", train_step, True)):
                    net.train(mode)
                    wall, gpu = per_layer.timed(fn, args.warmup, args.reps)
                    rows.append({"network": run_name, "dtype": dtype_name, "pass": pass_name, "algo": algo_name,
                                 "spconv_s": wall, "spconv_gpu_s": gpu})
                    print(f"  {algo_name:<18} {dtype_name} {pass_name}: {wall * 1e3:.3f} ms "
                          f"(CUDA events {gpu * 1e3:.3f})", flush=True)
                    if args.kernels:
                        trace_kernels(args, fn, {"network": run_name, "dtype": dtype_name, "pass": pass_name,
                                                 "side": "spconv", "algo": algo_name})
            save(args, rows, errors, first_parted)


KERNEL_CALLS = 3  # calls traced for --kernels, as on our side


def trace_kernels(args, fn, key):
    """Traces KERNEL_CALLS calls of fn under PyTorch's profiler and appends, as our side does,
    the GPU's busy time per call (the union of its kernels', copies' and memsets' intervals)
    and the costliest kernels to <exchange>/kernels.jsonl."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(KERNEL_CALLS):
            fn()
        torch.cuda.synchronize()
    # PyTorch's times are microseconds
    events = [(e.time_range.start, e.time_range.end, e.name) for e in prof.events() if e.device_type == DeviceType.CUDA]
    busy_ms, top = rank_events(events, KERNEL_CALLS, args.kernels, 1e3)
    append_kernel_row(os.path.join(args.exchange, "kernels.jsonl"), key, busy_ms, top, KERNEL_CALLS)


def save(args, rows, errors, first_parted):
    best = {}
    for r in rows:  # spconv's faster algorithm per configuration
        key = (r["network"], r["dtype"], r["pass"])
        if key not in best or r["spconv_s"] < best[key]["spconv_s"]:
            best[key] = r
    with open(os.path.join(args.exchange, "spconv.json"), "w") as f:
        json.dump({"rows": list(best.values()), "all_algos": rows, "rel_err": errors,
                   "first_convolution_beyond_tolerance": first_parted}, f)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--exchange", default="/tmp/site_e2e")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--tolerance", type=float, default=1e-3,
                   help="largest relative difference from ours of the fp32 outputs and loss accepted")
    # Float32 itself moves these gradients by that much: our CPU kernels' resunet42 weight
    # gradients in float32 against float64 differ by 9e-3 (median layer) to 7e-2 (largest),
    # since the loss sums signed terms over 173,011 sites (docs/benchmarks.md).
    p.add_argument("--grad-tolerance", type=float, default=0.1,
                   help="largest relative difference from ours of the fp32 weight gradients accepted")
    p.add_argument("--every-orientation", action="store_true",
                   help="print where each of the eight kernel orientations first parts from ours")
    p.add_argument("--record-mismatch", action="store_true",
                   help="time a network that differs from ours beyond --tolerance too (its rows carry the error) "
                        "instead of stopping")
    p.add_argument("--kernels", type=int, default=0, metavar="N",
                   help="also trace 3 calls of each pass and give the GPU's busy time per call and its N costliest "
                        "kernels (rows appended to <exchange>/kernels.jsonl)")
    args = p.parse_args()
    run(args)


if __name__ == "__main__":
    main()
