"""spconv 2.3.8's side of benchmarks/site_conv_profile.py: one fp16 submanifold or strided
layer of a benchmark scene through spconv (MaskImplicitGemm unless --algo native), run a
few times after its own tuning calls, so that a profiler can name and time the kernels
spconv picks, e.g. on the lent GPU:

    ncu --clock-control none -k regex:'(?i)gemm|conv' --metrics gpu__time_duration.sum \\
        python3 benchmarks/site_conv_profile_spconv.py --scene synthetic_lidar_5cm_b4 --level 1 --channels 128
"""
import argparse
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from site_scenes import scenes  # noqa: E402

import spconv.pytorch as spconv  # noqa: E402
from spconv.core import ConvAlgo  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scene", default="synthetic_lidar_5cm_b4")
    p.add_argument("--level", type=int, default=1, choices=(0, 1, 2))
    p.add_argument("--channels", type=int, default=128)
    p.add_argument("--algo", default="mask_implicit_gemm", choices=("mask_implicit_gemm", "native"))
    p.add_argument("--calls", type=int, default=8)
    args = p.parse_args()
    algo = ConvAlgo.MaskImplicitGemm if args.algo == "mask_implicit_gemm" else ConvAlgo.Native
    coords, spatial, batch = scenes([args.scene])[args.scene]
    x = spconv.SparseConvTensor(torch.zeros(len(coords), 1, device="cuda"),
                                torch.tensor(coords, dtype=torch.int32, device="cuda"), spatial.tolist(), batch)
    for level in range(args.level):  # down to the level's sites, as site_conv_gpu.py's maps
        x = spconv.SparseConv3d(1, 1, 2, stride=2, bias=False, indice_key=f"down{level + 1}", algo=algo).cuda()(x)
    n = x.indices.shape[0]
    x = x.replace_feature(torch.randn(n, args.channels, device="cuda", dtype=torch.float16))
    conv = spconv.SubMConv3d(args.channels, args.channels, 3, bias=False, indice_key="subm", algo=algo).cuda().half()
    with torch.no_grad():
        for _ in range(args.calls):
            y = conv(x)
    torch.cuda.synchronize()
    print(f"{args.scene} level {args.level}: {n:,} sites, C {args.channels}, {args.algo}; "
          f"checksum {float(y.features.float().sum()):.3f}", flush=True)


if __name__ == "__main__":
    main()
