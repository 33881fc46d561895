#!/usr/bin/env python3
"""A small transfers API that does NOT deduplicate, for the gateway's tests.

It is what Oncekey's gateway stands in front of: an upstream that no one
wrote in Go, and that runs every request it gets. It reads the
Idempotency-Key header only to record it beside each execution, which it
counts in SQLite, so that a test can ask how often each key really ran.

A request can ask for a fault with the header X-Fault:
  slow=MS  wait MS milliseconds, then run and answer
  fail     answer 500 without running
  reset    run, then reset the connection without answering
  hang     run, then answer nothing until the client goes away
  large    run, then answer with the transfer and a note of 1.5 MiB

Endpoints: POST /transfers, GET /transfers/{id}, GET /_executions (the
counts), GET /openapi.yaml (this API's contract). Standard library only.
"""

import argparse
import json
import socket
import sqlite3
import struct
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SPEC = None  # the bytes of openapi.yaml, read at start


class Executions:
    """Every transfer that ran, in one SQLite database."""

    def __init__(self, path):
        self.lock = threading.Lock()
        self.db = sqlite3.connect(path, check_same_thread=False)
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS transfers ("
            " id TEXT PRIMARY KEY, idempotency_key TEXT, amount INTEGER NOT NULL,"
            " currency TEXT NOT NULL, ran_at REAL NOT NULL)"
        )
        self.db.commit()

    def run(self, key, amount, currency):
        transfer = {"id": str(uuid.uuid4()), "amount": amount, "currency": currency}
        with self.lock:
            self.db.execute(
                "INSERT INTO transfers VALUES (?, ?, ?, ?, ?)",
                (transfer["id"], key, amount, currency, time.time()),
            )
            self.db.commit()
        return transfer

    def get(self, transfer_id):
        with self.lock:
            row = self.db.execute(
                "SELECT id, amount, currency FROM transfers WHERE id = ?", (transfer_id,)
            ).fetchone()
        return None if row is None else {"id": row[0], "amount": row[1], "currency": row[2]}

    def counts(self):
        with self.lock:
            rows = self.db.execute(
                "SELECT coalesce(idempotency_key, ''), count(*) FROM transfers GROUP BY 1"
            ).fetchall()
        return {"total": sum(n for _, n in rows), "by_key": {k: n for k, n in rows}}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "upstream.py"

    def log_message(self, *args):
        pass  # quiet: the tests read answers, not logs

    def answer(self, status, doc, content_type="application/json", headers=()):
        body = json.dumps(doc).encode() if not isinstance(doc, bytes) else doc
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def problem(self, status, title, detail):
        self.answer(status, {"title": title, "status": status, "detail": detail}, "application/problem+json")

    def do_GET(self):
        if self.path == "/openapi.yaml":
            self.answer(200, SPEC, "application/yaml")
        elif self.path == "/_executions":
            self.answer(200, self.server.executions.counts())
        elif self.path.startswith("/transfers/"):
            transfer = self.server.executions.get(self.path[len("/transfers/"):])
            if transfer is None:
                self.problem(404, "Not found", "no such transfer")
            else:
                self.answer(200, transfer)
        else:
            self.problem(404, "Not found", "no such resource")

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length > 0 else b""
        if self.path != "/transfers":
            self.problem(404, "Not found", "no such resource")
            return
        try:
            body = json.loads(raw)
            amount, currency = body["amount"], body["currency"]
            valid = (
                isinstance(amount, int) and not isinstance(amount, bool) and 1 <= amount <= 1_000_000
                and isinstance(currency, str) and len(currency) == 3 and currency.isascii() and currency.isupper()
                and set(body) == {"amount", "currency"}
            )
        except (ValueError, TypeError, KeyError):
            valid = False
        if not valid:
            self.problem(400, "Invalid transfer", "want {amount: 1..1000000, currency: three capital letters}")
            return
        fault = self.headers.get("X-Fault", "")
        if fault == "fail":
            self.problem(500, "Internal error", "failed as asked (X-Fault: fail), without running")
            return
        if fault.startswith("slow="):
            time.sleep(int(fault[len("slow="):]) / 1000)
        transfer = self.server.executions.run(self.headers.get("Idempotency-Key"), amount, currency)
        if fault == "reset":
            # SO_LINGER with a zero timeout: close sends RST, not FIN.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True
            return
        if fault == "hang":
            self.connection.settimeout(None)
            while self.connection.recv(1):  # until the client closes
                pass
            self.close_connection = True
            return
        if fault == "large":
            transfer = dict(transfer, note="n" * (3 << 19))
        # A session cookie, as many APIs set: a replay must never hand it on.
        self.answer(201, transfer, headers=[("Location", "/transfers/" + transfer["id"]), ("Set-Cookie", "session=" + transfer["id"])])


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # a connection reset or left hanging on purpose is no error here


def main():
    global SPEC
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0, help="0: any free port")
    parser.add_argument("--db", default=":memory:", help="the SQLite database of executions")
    parser.add_argument("--spec", required=True, help="this API's openapi.yaml, served at /openapi.yaml")
    args = parser.parse_args()
    with open(args.spec, "rb") as f:
        SPEC = f.read()
    server = Server(("127.0.0.1", args.port), Handler)
    server.executions = Executions(args.db)
    print("listening on 127.0.0.1:%d" % server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
