"""The whole training call of a site network on the CPU: site_e2e_gpu.py's network (its
Keras model, loss and gradients of every weight, kernel maps built in the call) on the
LiDAR frame, timed in this process, one row appended per run.

For comparing two builds of the op library, run it once per build, alternating, each from
a tree with that build (--label names the build in the row):

    python benchmarks/site_train_cpu.py --label before      # from the old tree
    python benchmarks/site_train_cpu.py --label after       # from this one

Row (results/site_train_cpu.jsonl): network, dtype, label, median_s, seconds (every timed
call), n_sites, device, threads, date, commit.
"""
import argparse
import datetime
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--network", choices=("resunet42_lidar_5cm_b1", "resunet42_lidar_5cm_b2", "unet5_lidar_5cm"),
                   default="resunet42_lidar_5cm_b1")
    p.add_argument("--dtype", choices=("fp32", "fp16"), default="fp32")
    p.add_argument("--label", required=True, help="names the op library build in the row")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--lidar", default=None)
    p.add_argument("--tiny", action="store_true", help="a small random scene instead of the frame (tests)")
    p.add_argument("--out", default=os.path.join(HERE, "results", "site_train_cpu.jsonl"))
    args = p.parse_args()
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    import tensorflow as tf
    import site_e2e_gpu as e2e
    from run_info import checkout_commit
    from site_networks import conv_weights, network, scene
    net, batch = e2e.RUNS[args.network]
    steps = network(net)
    coords, spatial, features = scene(net, batch, args.lidar or e2e.LIDAR, tiny=args.tiny)
    dtype = {"fp32": "float32", "fp16": "float16"}[args.dtype]
    model, convs, _, _ = e2e.build_model(steps, spatial, features.shape[1], dtype)
    for name, w in conv_weights(net, steps).items():
        convs[name].kernel.assign(w.astype(dtype))
    _, train = e2e.functions(model, tf.constant(spatial), batch)
    c, f = tf.constant(coords), tf.constant(features.astype(dtype))
    print(f"{args.network} {args.dtype}: {len(coords):,} sites; {args.warmup} warm-up + {args.reps} timed calls",
          flush=True)
    for _ in range(args.warmup):
        train(c, f)[0].numpy()
    seconds = []
    for i in range(args.reps):
        t = time.perf_counter()
        train(c, f)[0].numpy()
        seconds.append(time.perf_counter() - t)
        print(f"  call {i + 1}/{args.reps}: {seconds[-1]:.2f} s", flush=True)
    row = {"network": args.network, "dtype": args.dtype, "label": args.label, "median_s": statistics.median(seconds),
           "seconds": seconds, "n_sites": int(len(coords)), "device": "CPU", "threads": os.cpu_count(),
           "date": datetime.date.today().isoformat(), "commit": checkout_commit()}
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "a") as out:
        out.write(json.dumps(row) + "\n")
    print(f"summary: {args.label}: median {row['median_s']:.2f} s per training call -> {args.out}", flush=True)


if __name__ == "__main__":
    main()
