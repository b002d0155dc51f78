"""Benchmark: the live server under load, through a real uvicorn server on 127.0.0.1 (issue 47's load goal).

``--clients`` clients (default 20) at once, each on its own HTTP connection, each sending ``--edits`` edits
(default 50) and ``--ablations`` ablations (default 10, one after every fifth edit) of a few texts, for
``--rounds`` rounds (default 3). Every answer is compared with the session's sequential answer to the same
request, computed before the load (JSON equal: every statistic, map and output value); none may be lost
(each client counts its 200 answers). The process's resident memory (VmRSS, MiB) is printed after each round:
the goal is flat after the first round, within 10%. Prints requests per second, the answers' median and 95th
percentile latency (ms), and uptime's load before and after.

Usage: python benchmarks/bench_live_load.py [--model minilm] [--clients 20] [--edits 50] [--ablations 10]
       [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_capture import _rss_kib  # noqa: E402  (the same memory figure as the capture benchmark)


def rss_mib() -> float:
    """This process's resident memory now (VmRSS, MiB)."""
    return _rss_kib("VmRSS") / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="minilm")
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--edits", type=int, default=50)
    ap.add_argument("--ablations", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    import httpx
    import uvicorn

    from probe.live.server import bind, make_app, new_token
    from probe.live.session import open_session
    from probe.text.corpus import sample_texts

    session = open_session(args.model)
    texts = sample_texts()[:5]
    heads = [[0, 1], [1, 2]]
    # the sequential answers, JSON round-tripped as the server sends them
    expect = {("edit", t): json.loads(json.dumps(session.edit(t, 1))) for t in texts}
    expect |= {("ablate", t): json.loads(json.dumps(session.ablate(t, heads, "zero", 1))) for t in texts}

    token = new_token()
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    app = make_app(session, token, hosts={f"127.0.0.1:{port}"})
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    base = f"http://127.0.0.1:{port}/api/"
    headers = {"X-Probe-Token": token}

    def client(i: int) -> tuple[int, int, list[float]]:
        """(answers equal to the sequential ones, answers in all, latencies in s) of one client's requests."""
        right, answered, took = 0, 0, []
        every = max(1, args.edits // max(1, args.ablations))
        with httpx.Client(base_url=base, headers=headers, timeout=600) as c:
            done_abl = 0
            for k in range(args.edits):
                t = texts[(i + k) % len(texts)]
                requests = [("edit", {"text": t, "layer": 1})]
                if (k + 1) % every == 0 and done_abl < args.ablations:
                    requests.append(("ablate", {"text": t, "heads": heads, "layer": 1}))
                    done_abl += 1
                for route, body in requests:
                    t0 = time.perf_counter()
                    r = c.post(route, json=body)
                    took.append(time.perf_counter() - t0)
                    if r.status_code == 200:
                        answered += 1
                        right += r.json() == expect[(route, t)]
        return right, answered, took

    per_client = args.edits + args.ablations
    print(f"{args.model}: {args.clients} clients x ({args.edits} edits + {args.ablations} ablations) = "
          f"{args.clients * per_client:,} requests a round, {args.rounds} rounds; "
          f"load average {os.getloadavg()[0]:.2f} before; RSS {rss_mib():.0f} MiB after the sequential answers")
    rss = []
    try:
        for rnd in range(args.rounds):
            t0 = time.perf_counter()
            with ThreadPoolExecutor(args.clients) as pool:
                results = list(pool.map(client, range(args.clients)))
            wall = time.perf_counter() - t0
            right = sum(r[0] for r in results)
            answered = sum(r[1] for r in results)
            took = sorted(x for r in results for x in r[2])
            rss.append(rss_mib())
            print(f"round {rnd + 1}: {answered:,} of {args.clients * per_client:,} answered, {right:,} equal to the "
                  f"sequential answers; {answered / wall:.1f} requests/s; latency median "
                  f"{1000 * statistics.median(took):.0f} ms, 95th percentile "
                  f"{1000 * took[int(0.95 * (len(took) - 1))]:.0f} ms; RSS {rss[-1]:.0f} MiB")
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
    growth = max(rss[1:]) / rss[0] - 1 if len(rss) > 1 else 0.0
    print(f"RSS after later rounds within {100 * growth:+.1f}% of the first round's (goal: within 10%); "
          f"load average {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()
