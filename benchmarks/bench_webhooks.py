"""Webhook intake under load: N requests/s for T seconds against the real app, then count what the store kept.

Starts `hf-export-bot serve` (uvicorn, embedded worker, `dry` backend: no Hub, no exports) on a loopback port with
a fresh SQLite store, sends signed `repo.content` main updates at a fixed rate (open loop: a request is sent at its
scheduled time whatever the server is doing, and its latency counts from that time), and prints:

- p50 / p90 / p99 / max acknowledgement latency (scheduled send -> 202 received);
- lost events: accepted deliveries (202 queued/duplicate) missing from the store. Every accepted delivery must be
  either a job of its own or counted in its job's `deliveries`; 10% of the requests replay an earlier event.

Usage:
    .venv/bin/python benchmarks/bench_webhooks.py [--rate 200] [--duration 30] [--replay 0.1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
SECRET = "bench-secret-0123456789"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def event(repo: str, new_sha: str) -> bytes:
    return json.dumps({
        "event": {"action": "update", "scope": "repo.content"},
        "repo": {"type": "model", "name": repo, "id": "0" * 24, "private": False,
                 "url": {"web": f"https://hf.co/{repo}"}, "owner": {"id": "1" * 24}, "headSha": new_sha},
        "webhook": {"id": "2" * 24, "version": 3},
        "updatedRefs": [{"ref": "refs/heads/main", "oldSha": "f" * 40, "newSha": new_sha}],
    }).encode()


class Connection:
    """One keep-alive HTTP/1.1 connection on asyncio streams (httpx's pool costs more CPU than the server under
    test: on 2 cores the load generator must stay light)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, host: str, port: int) -> Connection:
        reader, writer = await asyncio.open_connection(host, port)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return cls(reader, writer)

    async def post(self, request: bytes) -> tuple[int, bytes]:
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return status, await self.reader.readexactly(length)

    def close(self) -> None:
        self.writer.close()


def http_request(host: str, port: int, body: bytes) -> bytes:
    return (f"POST /webhooks/hub HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"X-Webhook-Secret: {SECRET}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


async def fire(host: str, port: int, rate: float, duration: float, replay: float,
               max_connections: int) -> tuple[list[float], list[dict], int]:
    """Send `rate * duration` requests at fixed times; reuse idle connections, open new ones up to a cap."""
    total = int(rate * duration)
    latencies: list[float] = []
    accepted: list[dict] = []
    errors = 0
    sent: list[bytes] = []
    rng = random.Random(0)
    idle: list[Connection] = []
    opened = stale = 0
    slots = asyncio.Semaphore(max_connections)

    async def one(scheduled: float, request: bytes) -> None:
        nonlocal errors, opened, stale
        async with slots:
            connection = idle.pop() if idle else None
            for reused in (connection is not None, False):
                try:
                    if connection is None:
                        connection = await Connection.open(host, port)
                        opened += 1
                    status, body = await connection.post(request)
                    break
                except (OSError, asyncio.IncompleteReadError, ValueError) as err:
                    if connection is not None:
                        connection.close()
                    connection = None
                    if reused:  # the server closed an idle keep-alive connection: retry on a new one, as clients do
                        stale += 1
                        continue
                    print(f"request failed: {type(err).__name__}: {err}")
                    errors += 1
                    return
            idle.append(connection)
        latencies.append(time.perf_counter() - scheduled)
        answer = json.loads(body) if status == 202 else {}
        if answer.get("status") in ("queued", "duplicate"):
            accepted.append(answer)
        else:
            errors += 1
            print(f"unexpected answer {status}: {body[:200]!r}")

    tasks = []
    start = time.perf_counter() + 0.2
    for n in range(total):
        if sent and rng.random() < replay:
            body = rng.choice(sent)
        else:
            body = event(f"bench/model-{n % 20}", f"{n + 1:040x}")
            sent.append(body)
        request = http_request(host, port, body)
        scheduled = start + n / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(scheduled, request)))
    await asyncio.gather(*tasks)
    for connection in idle:
        connection.close()
    print(f"(load generator: {opened} connections opened, {stale} requests resent after the server closed an idle "
          "keep-alive connection)")
    return latencies, accepted, errors


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 10) - 1] if len(values) > 1 else values[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=200.0, help="requests per second")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds")
    parser.add_argument("--replay", type=float, default=0.1, help="share of requests replaying an earlier event")
    parser.add_argument("--connections", type=int, default=64, help="most connections open at once")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-webhooks-") as tmp:
        db = Path(tmp) / "bot.db"
        port = free_port()
        env = {**os.environ, "WEBHOOK_SECRET": SECRET, "EXPORT_BOT_DB": str(db), "EXPORT_BOT_BACKEND": "dry",
               "EXPORT_BOT_ALLOWED": "bench", "EXPORT_BOT_DAILY_LIMIT": "0", "EXPORT_BOT_WORK_DIR": tmp,
               "EXPORT_BOT_POLL_SECONDS": "0.05"}
        server = subprocess.Popen(
            [sys.executable, "-m", "bot.cli", "serve", "--port", str(port), "--log-level", "warning"],
            cwd=ROOT, env=env)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while True:
                try:
                    if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit("the bot did not start")
                time.sleep(0.1)
            began = time.perf_counter()
            latencies, accepted, errors = asyncio.run(fire("127.0.0.1", port, args.rate, args.duration,
                                                           args.replay, args.connections))
            elapsed = time.perf_counter() - began
            time.sleep(1.0)  # let the embedded worker drain (dry jobs)
        finally:
            server.terminate()
            server.wait(30)
        conn = sqlite3.connect(db)
        ids = {row[0] for row in conn.execute("SELECT id FROM jobs")}
        deliveries = conn.execute("SELECT COALESCE(SUM(deliveries), 0) FROM jobs").fetchone()[0]
        states = dict(conn.execute("SELECT status, COUNT(*) FROM jobs GROUP BY status").fetchall())
        conn.close()
    missing_jobs = sum(1 for a in accepted if a["job"] not in ids)
    lost = missing_jobs + max(0, len(accepted) - deliveries)
    ms = [x * 1000 for x in latencies]
    print(f"sent {int(args.rate * args.duration)} requests in {elapsed:.1f}s ({len(latencies) / elapsed:.0f}/s "
          f"answered), {len(accepted)} accepted, {errors} errors")
    print(f"ack latency ms: p50 {percentile(ms, 50):.1f}  p90 {percentile(ms, 90):.1f}  "
          f"p99 {percentile(ms, 99):.1f}  max {max(ms):.1f}")
    print(f"store: {len(ids)} jobs ({states}), {deliveries} deliveries; lost events: {lost}")
    sys.exit(1 if lost or errors else 0)


if __name__ == "__main__":
    main()
