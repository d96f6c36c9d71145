#!/usr/bin/env python3
"""Bagua's algorithms against torch DDP (and DDP's compression hooks), same model, same data,
same ranks, same transport, one command, one table.

    python3 bench/ddp/compare.py --device cpu --nproc 2                   # loopback
    python3 bench/ddp/compare.py --device cpu --nproc 2 --link 10gbit     # netns + tc htb
    python3 bench/ddp/compare.py --device cuda --nproc 2 --share-gpu --net bagua-net --link 10gbit
    python3 bench/ddp/compare.py --tta --device cpu --nproc 2 --link 1gbit --plot /tmp/tta

--tta measures time to accuracy instead of step time (tta.py, tta_report.py): every contestant
trains until its evaluation metric reaches a target, or --max-steps; the table gives the wall
time and steps to the target, the speed against DDP and against the fastest torch contestant,
and the metric at the cap; --plot writes the metric against wall time as PNG.

Contestants (--contestants, default all): torch DDP; DDP + bf16 compression hook (fp16 on CPU:
gloo has no bf16 all-reduce in torch 1.13); DDP + PowerSGD hook; bagua's gradient_allreduce,
bytegrad, qadam, decentralized and low_precision_decentralized (``with_bagua``). Every
contestant runs in the same rank processes (worker.py), from the same initial weights, on the
same per-rank batches, interleaved round by round. Models (--models): a GPT-style transformer LM
on text from a fixed random Markov chain (its entropy rate is the loss floor), and ResNet-50's
layout (written here; torchvision not needed) on synthetic class-template images.

The link (--link RATE, e.g. 10gbit): on CPU each rank runs in its own network namespace with a
veth into a bridge and a tc htb cap on its egress (netlink.py), so gloo and bagua's host backend
(forced onto TCP: BAGUA_HOST_SHM=0) share the same shaped link. On CUDA, NCCL runs over
Bagua-Net for both torch DDP and bagua with BAGUA_NET_SEND_RATE_MBPS capping each rank's send
rate (the plugin's pacing), since NCCL's Socket transport has no cap.

Columns: step ms (median of the timed rounds' mean step time), speed vs DDP (median over the
timed rounds of DDP's block time / this one's in the same round: > 1 is faster), the rank-averaged training loss of the last tenth of the steps, the
loss on a fixed evaluation set (rank average), that loss relative to DDP's, and the largest
difference between a rank's weights and rank 0's (0 for the centralized algorithms). cpu ms:
rank 0's CPU time per step, every thread of the process (median over the timed rounds): the
cost that is left when the machine is shared and wall times swing.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import netlink  # noqa: E402
import tta_report  # noqa: E402
import step_profile  # noqa: E402

ALL = ["ddp", "ddp_bf16", "ddp_powersgd", "gradient_allreduce", "bytegrad", "qadam",
       "decentralized", "low_precision_decentralized"]
# Also accepted: gradient_allreduce's variants (worker.VARIANTS): _sync (each bucket's collective
# finished before the next one starts: the older, sequential reducer, kept for comparison),
# _copied (do_flatten=False: gradients copied into the buckets and back), _bucket_copies (CUDA
# buckets copied in and back, EngineOptions.in_place_device_buckets off: the older default, kept
# for comparison); and every algorithm with hierarchical=True
# (_hier: intra-node, then among node leaders; with --nodes).
# ddp_fused: DDP with torch's fused optimizer (fused=True); gradient_allreduce_fused: with_bagua
# and Bagua's fused optimizer, each bucket stepped inside the backward pass (the default);
# gradient_allreduce_fused_after: the same, stepped after backward.
EXTRA = ["ddp_fused", "gradient_allreduce_fused", "gradient_allreduce_fused_after",
         "gradient_allreduce_sync", "gradient_allreduce_copied",
         "gradient_allreduce_bucket_copies",
         "gradient_allreduce_hier", "bytegrad_hier", "qadam_hier", "decentralized_hier",
         "low_precision_decentralized_hier"]
# --tta's default contestants: torch DDP, its bf16 hook (fp16 on CPU) and PowerSGD hook at
# ranks 1 and 4, our six algorithms, our powersgd at ranks 1 and 4 and at rank 16 with 8-bit
# factors (skipped, saying so, where it is not registered), and auto.
TTA_ALL = ["ddp", "ddp_bf16", "ddp_powersgd1", "ddp_powersgd4", "gradient_allreduce",
           "bytegrad", "decentralized", "low_precision_decentralized", "qadam", "async",
           "powersgd1", "powersgd4", "powersgd16q", "auto"]
# Accepted in both modes: async (its averaging thread paused between its blocks), auto, and
# PowerSGD (tta_report.is_powersgd; POWERSGD_NAMES): at --powersgd-rank without digits, else at
# the rank the digits name.
MORE = ["async", "auto"]
POWERSGD_NAMES = ("ddp_powersgd[<N>] (torch's hook), powersgd[<N>] (ours), powersgd[<N>]q (ours, "
                  "8-bit factors)")
DEFAULT_PRESET = {("cpu", "transformer"): "tiny", ("cpu", "resnet50"): "tiny",
                  ("cuda", "transformer"): "gpt2", ("cuda", "resnet50"): "resnet50"}


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--nproc", type=int, default=2, help="ranks (default 2)")
    ap.add_argument("--models", default="transformer,resnet50",
                    help="comma-separated: transformer, resnet50")
    ap.add_argument("--preset", default="",
                    help="model size: tiny, mid, small, gpt2, gpt2-chain (transformer); tiny, small, "
                         "resnet50 (resnet); default tiny on CPU, gpt2 / resnet50 on CUDA")
    ap.add_argument("--contestants", default=None,
                    help="comma-separated, default all: " + ", ".join(ALL) + " (with --tta: " +
                         ", ".join(TTA_ALL) + "); also " + ", ".join(MORE) + ", " +
                         POWERSGD_NAMES)
    ap.add_argument("--rounds", type=int, default=5, help="rounds; the first is not timed")
    ap.add_argument("--round-steps", type=int, default=4, help="steps per contestant per round")
    ap.add_argument("--lr", type=float, default=0,
                    help="Adam's (and QAdam's) learning rate (default 1e-3; with --tta 5e-3)")
    ap.add_argument("--optimizer", default="adam", choices=["adam", "adamw"],
                    help="every contestant's optimizer but qadam's (default adam)")
    ap.add_argument("--lr-warmup", type=int, default=0,
                    help="with --tta: the learning rate rises linearly to --lr over this many "
                         "steps, the same for every contestant (default 0: constant). A deep "
                         "LM from scratch (gpt2-chain) needs it: bench/ddp/lr_probe.py shows "
                         "which warm-up and rate learn the chain soonest")
    ap.add_argument("--algo-warmup", type=int, default=0,
                    help="QAdam warm-up steps and PowerSGD's start iteration, torch's hook's and "
                         "ours, and async's warm-up with --tta (default: the first round; with "
                         "--tta a tenth of --max-steps). QAdam's losses need tens of steps: "
                         "with a few, its variance frozen from 3 steps makes Bagua's update grow "
                         "until it diverges (nan on GPT-2 with 4); step 80's long10 uses 30")
    ap.add_argument("--powersgd-rank", type=int, default=1)
    ap.add_argument("--bucket-mb", type=float, default=0,
                    help="bucket size for both (0: each one's default, DDP 25 MB, bagua 25 MiB)")
    ap.add_argument("--batch", type=int, default=0, help="per-rank batch (0: the preset's)")
    ap.add_argument("--link", default="none", help="'none' or " + netlink.RATE_HELP)
    ap.add_argument("--net", default="socket", choices=["socket", "bagua-net", "nvlink"],
                    help="CUDA: NCCL's transport between ranks: socket or bagua-net take the "
                         "network path (P2P/SHM off); nvlink leaves NCCL its defaults inside "
                         "the host (P2P over NVLink; one rank per GPU, no --link)")
    ap.add_argument("--share-gpu", action="store_true",
                    help="CUDA: every rank on cuda:0 (start MPS first), NCCL_HOSTID per rank")
    ap.add_argument("--nodes", type=int, default=0,
                    help="group the ranks into N 'nodes' of nproc/N (LOCAL_WORLD_SIZE) for the "
                         "_hier contestants; CUDA: every rank on its own GPU, one NCCL_HOSTID per "
                         "node with P2P and SHM on, so only traffic between nodes takes the "
                         "network path (default 0: no grouping)")
    ap.add_argument("--bagua-transport", default="",
                    choices=["", "auto", "engine"],
                    help="CPU: bagua's host transport (default: auto; engine with --link)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads per rank")
    ap.add_argument("--build", default=os.environ.get("BAGUA_BUILD", os.path.join(ROOT, "build")))
    ap.add_argument("--timeout", type=float, default=900, help="seconds per model")
    ap.add_argument("--json", default="", help="write every result here")
    tta = ap.add_argument_group("time to accuracy (--tta)")
    tta.add_argument("--tta", action="store_true",
                     help="train every contestant to a target metric (or --max-steps) instead "
                          "of timing steps")
    tta.add_argument("--max-steps", type=int, default=300,
                     help="step cap (rounded up to a multiple of --eval-every; default 300)")
    tta.add_argument("--eval-every", type=int, default=10,
                     help="steps between evaluations (default 10): the resolution of the time "
                          "to target")
    tta.add_argument("--eval-batches", type=int, default=16,
                     help="held-out batches per evaluation (default 16)")
    tta.add_argument("--lm-margin", type=float, default=0.35,
                     help="transformer target: eval loss <= the Markov chain's loss floor + "
                          "this, in nats per token (default 0.35)")
    tta.add_argument("--target-acc", type=float, default=95.0,
                     help="resnet50 target: top-1 accuracy in %% on held-out images (default "
                          "95)")
    tta.add_argument("--stop-at-target", action="store_true",
                     help="stop a contestant at its target (saves time; no metric at the cap)")
    tta.add_argument("--plot", default="",
                     help="PNG path prefix: PREFIX-<model>.png, the metric against wall time")
    ap.add_argument("--profile", action="store_true",
                    help="after the timed rounds, one more block per contestant under "
                         "torch.profiler: rank 0's ms per step of compute, exposed communication, "
                         "optimizer and GPU idle (CPU: the trainer thread's), and the top "
                         "kernels or ops (step_profile.py)")
    a = ap.parse_args()
    if a.nproc < 1:
        ap.error("--nproc must be >= 1")
    if a.nodes < 0 or (a.nodes and a.nproc % a.nodes):
        ap.error("--nodes {}: must divide --nproc {}".format(a.nodes, a.nproc))
    if a.nodes and (a.share_gpu or a.link != "none"):
        ap.error("--nodes puts each rank on its own GPU and keeps node-local traffic off the "
                 "network: not with --share-gpu or --link")
    if a.rounds < 2 or a.round_steps < 1:
        ap.error("--rounds must be >= 2 (the first is warm-up) and --round-steps >= 1")
    for m in a.models.split(","):
        if m not in ("transformer", "resnet50"):
            ap.error("--models: {!r} is not one of transformer, resnet50".format(m))
    if a.contestants is None:
        a.contestants = ",".join(TTA_ALL if a.tta else ALL)
    for c in a.contestants.split(","):
        if c not in ALL + EXTRA + MORE and not tta_report.is_powersgd(c):
            ap.error("--contestants: {!r} is not one of {}, {}".format(
                c, ", ".join(ALL + EXTRA + MORE), POWERSGD_NAMES))
    if a.lr <= 0:
        a.lr = 5e-3 if a.tta else 1e-3
    if a.tta:
        if a.max_steps < 1 or a.eval_every < 1 or a.eval_batches < 1:
            ap.error("--max-steps, --eval-every and --eval-batches must be >= 1")
        if a.profile:
            ap.error("--profile times steps: not with --tta")
        if not a.algo_warmup:
            a.algo_warmup = max(2, a.max_steps // 10)
    elif a.plot or a.stop_at_target:
        ap.error("--plot and --stop-at-target go with --tta")
    if a.link != "none":
        try:
            netlink.parse_rate(a.link)
        except ValueError as e:
            ap.error(str(e))
        if a.device == "cuda" and a.net != "bagua-net":
            ap.error("--link on CUDA caps Bagua-Net's send rate: add --net bagua-net")
    if a.net == "nvlink" and (a.device != "cuda" or a.share_gpu or a.nodes):
        ap.error("--net nvlink: CUDA ranks on their own GPUs, without --share-gpu or --nodes")
    return a


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(args, rank, master, port):
    env = dict(os.environ)
    py = [os.path.join(ROOT, "python"), os.path.join(args.build, "python")]
    env["PYTHONPATH"] = os.pathsep.join(py + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(MASTER_ADDR=master, MASTER_PORT=str(port), RANK=str(rank),
               WORLD_SIZE=str(args.nproc), LOCAL_RANK=str(rank),
               LOCAL_WORLD_SIZE=str(args.nproc), OMP_NUM_THREADS=str(args.threads))
    if args.link != "none" or args.share_gpu:
        # Every rank its own "node": the link (or NCCL's network path) is between all of them.
        env.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    local = args.nproc // args.nodes if args.nodes else 0
    if local:
        env.update(LOCAL_RANK=str(rank % local), LOCAL_WORLD_SIZE=str(local))
    if args.device == "cpu":
        transport = args.bagua_transport or ("engine" if args.link != "none" else "auto")
        env["BAGUA_HOST_TRANSPORT"] = transport
        if args.link != "none":
            env["BAGUA_HOST_SHM"] = "0"  # namespaces share /dev/shm: keep bytes on the link
            env["GLOO_SOCKET_IFNAME"] = "eth0"
        return env
    env.update(NCCL_SOCKET_IFNAME="lo", NCCL_IB_DISABLE="1")
    if not args.share_gpu:
        env["BAGUA_BENCH_CUDA_DEVICE"] = str(rank)  # every rank its own GPU of this host
    if args.net == "nvlink":  # one host as NCCL sees it: P2P (NVLink) and SHM as it picks
        env.update(NCCL_NET_PLUGIN="none", LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(args.nproc))
        return env
    if local:
        env["NCCL_HOSTID"] = "bagua-bench-node{}".format(rank // local)
    else:
        env.update(NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1")
        if args.share_gpu or args.link != "none":  # every rank its own "host"
            env["NCCL_HOSTID"] = "bagua-bench-rank{}".format(rank)
    if args.net == "bagua-net":
        plugin = os.path.join(args.build, "net_plugin")
        env["LD_LIBRARY_PATH"] = os.pathsep.join(
            [plugin] + [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p])
        # BAGUA_NET_PLUGIN_PATH: an installed plugin (bagua.net_plugin_path()) instead of the
        # build's.
        env.update(NCCL_NET_PLUGIN=os.environ.get("BAGUA_NET_PLUGIN_PATH") or "bagua",
                   NCCL_NET="Bagua")
        if args.link != "none":
            env["BAGUA_NET_SEND_RATE_MBPS"] = str(int(netlink.parse_rate(args.link) / 1e6))
    else:
        env.update(NCCL_NET_PLUGIN="none", NCCL_NET="Socket")
    return env


def run_model(args, model, link):
    preset = args.preset or DEFAULT_PRESET[(args.device, model)]
    contestants = args.contestants
    if args.device == "cpu":  # gloo (torch 1.13) cannot all-reduce bf16: the fp16 hook instead
        contestants = contestants.replace("ddp_bf16", "ddp_fp16")
    warm = args.algo_warmup or args.round_steps
    out = tempfile.NamedTemporaryFile(prefix="bagua-ddp-", suffix=".json", delete=False).name
    wargs = ["--device", args.device, "--model", model, "--preset", preset, "--contestants",
             contestants, "--rounds", str(args.rounds), "--round-steps", str(args.round_steps),
             "--lr", str(args.lr), "--algo-warmup", str(warm), "--powersgd-rank",
             str(args.powersgd_rank), "--bucket-mb", str(args.bucket_mb), "--threads",
             str(args.threads), "--batch", str(args.batch), "--optimizer", args.optimizer,
             "--out", out] + \
        (["--profile"] if args.profile else [])
    if args.tta:
        wargs += ["--tta", "--max-steps", str(args.max_steps), "--eval-every",
                  str(args.eval_every), "--eval-batches", str(args.eval_batches), "--lm-margin",
                  str(args.lm_margin), "--target-acc", str(args.target_acc),
                  "--lr-warmup", str(args.lr_warmup)] + \
            (["--stop-at-target"] if args.stop_at_target else [])
    master = link.addr(0) if link else "127.0.0.1"
    port = 29500 if link else free_port()
    procs = []
    for r in range(args.nproc):
        cmd = (link.prefix(r) if link else []) + [sys.executable,
                                                  os.path.join(HERE, "worker.py")] + wargs
        procs.append(subprocess.Popen(cmd, env=rank_env(args, r, master, port),
                                      start_new_session=True))
    deadline = time.time() + args.timeout
    rc = 0
    try:
        for p in procs:
            left = max(1.0, deadline - time.time())
            try:
                code = p.wait(timeout=left)
            except subprocess.TimeoutExpired:
                print("compare: {} did not finish within {:.0f} s".format(model, args.timeout),
                      file=sys.stderr)
                code = 124
            rc = rc or code
            if code != 0:
                break
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
    if rc != 0:
        raise SystemExit("compare: a rank failed on {} (exit {})".format(model, rc))
    with open(out) as f:
        res = json.load(f)
    os.unlink(out)
    res["preset"] = preset
    return res


def paired_speed(base, row):
    """Median over the timed rounds of DDP's block time over this contestant's in the same
    round: adjacent blocks see the same load on a shared machine, so the ratio is steadier than
    the ratio of the two medians."""
    pairs = sorted(b / r for b, r in zip(base["round_ms"], row["round_ms"]) if r > 0)
    if not pairs:
        return float("nan")
    mid = len(pairs) // 2
    return pairs[mid] if len(pairs) % 2 else 0.5 * (pairs[mid - 1] + pairs[mid])


def table(args, res, link_desc):
    rows = res["results"]
    base = next((r for r in rows if r["name"] == "ddp"), None)
    floor = res.get("loss_floor")
    print()
    print("{} ({}, {:.1f} M parameters), {} ranks, {}, {}; {} steps each ({} rounds x {}, "
          "first round untimed); torch {}".format(
              res["model"], res["preset"], res["params"] / 1e6, res["world"], res["device"],
              link_desc, res["steps"], args.rounds, args.round_steps, res["torch"]))
    if floor is not None:
        print("loss floor (the Markov chain's entropy rate): {:.3f} nats/token".format(floor))
    hdr = "{:32s} {:>9s} {:>8s} {:>8s} {:>10s} {:>9s} {:>9s} {:>10s}".format(
        "contestant", "step ms", "vs DDP", "cpu ms", "train loss", "eval loss", "eval/DDP",
        "rank diff")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        speed = paired_speed(base, r) if base else float("nan")
        r["speed_vs_ddp"] = speed
        rel = r["eval_loss"] / base["eval_loss"] if base else float("nan")
        print("{:32s} {:9.2f} {:7.2f}x {:8.2f} {:10.4f} {:9.4f} {:9.3f} {:10.2e}".format(
            r["name"], r["step_ms"], speed, r["cpu_ms"], r["final_loss"], r["eval_loss"], rel,
            r["weight_spread"]))
    for r in rows:
        t = r.get("trace_ms_per_step")
        if t and t["buckets"] > 0:  # the decentralized algorithms run no gradient buckets
            print("  {} per step (ms, rank 0): hooks {:.2f}, finish waiting {:.2f}, copy-back "
                  "{:.2f}; bucket thread ({:.1f} buckets, {} in place): queued {:.2f}, waiting "
                  "for copies {:.2f}, communicating {:.2f}".format(
                      r["name"], t["mark"], t["finish_wait"], t["copy_out"], t["buckets"],
                      "{}/{}".format(*r["buckets_in_place"]) if "buckets_in_place" in r else "?",
                      t["bucket_queue"], t["bucket_wait"], t["bucket_run"]))
    for line in step_profile.summary_lines(rows):
        print(line)
    ga = next((r for r in rows if r["name"] == "gradient_allreduce"), None)
    if ga is not None and "max_loss_diff_vs_ddp" in ga:
        print("gradient_allreduce vs ddp: largest per-step loss difference {:.2e}".format(
            ga["max_loss_diff_vs_ddp"]))


def main():
    args = parse()
    # A SIGTERM (timeout, the GPU script) unwinds: the ranks and the namespaces get cleaned up.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    link = None
    if args.net == "nvlink":
        link_desc = "NVLink (NCCL P2P inside the host, no cap)"
    elif args.link == "none":
        link_desc = ("loopback (NCCL {}{})".format(args.net, ", one GPU shared"
                                                   if args.share_gpu else "")
                     if args.device == "cuda" else
                     "loopback (gloo TCP; bagua host transport {})".format(
                         args.bagua_transport or "auto"))
    elif args.device == "cuda":
        link_desc = "link {} per rank (Bagua-Net send-rate cap, NCCL over Bagua-Net)".format(
            args.link)
    else:
        link = netlink.Link(args.nproc, args.link)
        link_desc = "link {} per rank (netns + tc htb; gloo TCP, bagua engine TCP)".format(
            args.link)
    everything = []
    ctx = link if link else _Null()
    with ctx:
        if link:
            got = link.measure(1.0)
            print("link check: one TCP stream rank 1 -> rank 0: {:.2f} Gbit/s (cap {})".format(
                got * 8 / 1e9, args.link))
        for model in args.models.split(","):
            res = run_model(args, model, link)
            res["link"] = link_desc
            if args.tta:
                tta_report.table(res, link_desc)
                if args.plot:
                    path = "{}-{}.png".format(args.plot, model)
                    try:
                        tta_report.plot(res, path, link_desc)
                        res["plot"] = path
                        print("plot: {}".format(path))
                    except ImportError as e:  # the JSON still has every point to draw later
                        print("plot: not drawn ({}); tta_report.py --plot draws it from the "
                              "JSON".format(e))
            else:
                table(args, res, link_desc)
            everything.append(res)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"argv": sys.argv, "date": time.strftime("%Y-%m-%d %H:%M"),
                       "runs": everything}, f, indent=1)
    return 0


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    sys.exit(main())
