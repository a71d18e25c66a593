"""What a real payment SDK sees through the gateway.

The official Stripe Python SDK sends `Idempotency-Key` on every POST and retries by itself
(on connection errors, 409 and 5xx). It is pointed at the gateway, in front of a fake payments
API on loopback that counts every charge it executes and can look a charge up by caller and
key (`GET /v1/charges/lookup`, Idempotency-Key and Authorization headers). Four cases:

1. the API executes the charge and the connection dies before the answer: the SDK retries
   with the same key, and the charge must not be made twice;
2. the API answers 500 once, then succeeds: the SDK's retry runs again (attempt 2) and
   succeeds;
3. the caller retries a finished charge with the same key: the stored charge comes back;
4. as 1, through a second gateway whose route reconciles (`[routes.idempotency.reconcile]`
   with the lookup): the SDK's own retry of the 502 gets the charge the API made, marked
   `Idempotency-Status: reconciled`, and the charge is still made once.

Run by scripts/sdk-check, which installs the SDK and builds the gateway.
"""

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import stripe


class Api:
    """The fake payments API: what it executed, per idempotency key."""

    def __init__(self):
        self.lock = threading.Lock()
        self.executed = defaultdict(list)  # key -> [attempt header values]
        self.charges = {}  # (authorization, key) -> the charge made
        self.lookups = defaultdict(int)  # key -> lookups asked
        self.plan = {}  # key prefix -> list of behaviours for successive executions

    def behaviour(self, key):
        with self.lock:
            for prefix, steps in self.plan.items():
                if key.startswith(prefix) and steps:
                    return steps.pop(0)
        return "answer"


API = Api()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        length = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(length).decode()
        key = self.headers.get("idempotency-key", "")
        caller = self.headers.get("authorization", "")
        with API.lock:
            API.executed[key].append(self.headers.get("idempotency-attempt"))
            n = len(API.executed[key])
        behaviour = API.behaviour(key)
        if behaviour == "fail":
            self.reply(500, {"error": {"type": "api_error", "message": "try again"}})
            return
        amount = re.search(r"amount=(\d+)", body)
        charge = {"id": f"ch_{abs(hash(key)) % 10**8}_{n}", "object": "charge",
                  "amount": int(amount.group(1)) if amount else 0, "currency": "usd"}
        with API.lock:
            API.charges[(caller, key)] = charge
        if behaviour == "drop":
            # Executed, and the answer is lost with the connection.
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.reply(200, charge)

    def do_GET(self):
        # The lookup the gateway asks when an answer was lost: the charge made for this
        # caller under this key, or 404.
        if self.path != "/v1/charges/lookup":
            self.reply(404, {"error": {"type": "invalid_request_error", "message": "no such path"}})
            return
        key = self.headers.get("idempotency-key", "")
        caller = self.headers.get("authorization", "")
        with API.lock:
            API.lookups[key] += 1
            charge = API.charges.get((caller, key))
        if charge is None:
            self.reply(404, {"error": {"type": "invalid_request_error",
                                       "message": "no such charge"}})
        else:
            self.reply(200, charge)

    def reply(self, status, doc):
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


CONFIG = """
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[store]
backend = "memory"

[upstreams.payments]
url = "http://127.0.0.1:{port}"
timeout = "5s"

[[routes]]
name = "charges"
methods = ["POST"]
path = "/v1/charges"
upstream = "payments"

[routes.idempotency]
scope = "header:Authorization"
{reconcile}
[[routes]]
name = "rest"
path = "/{{*rest}}"
upstream = "payments"
"""


# The charges route asks the API's lookup about a charge whose answer was lost. Only when a
# retry meets the key ("off"), so that the SDK's own retry is the one that finds the charge.
RECONCILE = """
[routes.idempotency.reconcile]
path = "/v1/charges/lookup"
after = "off"
"""


def start_gateway(binary, api_port, workdir, name, reconcile=""):
    path = os.path.join(workdir, f"{name}.toml")
    with open(path, "w") as f:
        f.write(CONFIG.format(port=api_port, reconcile=reconcile))
    log = os.path.join(workdir, f"{name}.log")
    proc = subprocess.Popen([binary, "--config", path], stdout=subprocess.PIPE,
                            stderr=open(log, "w"), text=True)
    line = proc.stdout.readline()
    match = re.search(r"proxy=(\S+)", line)
    if not match:
        proc.kill()
        sys.exit(f"the gateway did not start: {line!r}; see {log}")
    return proc, match.group(1)


def check(name, ok, detail):
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
    return ok


def main():
    binary = sys.argv[1]
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    workdir = tempfile.mkdtemp(prefix="idemgate-sdk-")
    gateway, address = start_gateway(binary, server.server_address[1], workdir, "gateway")
    reconciling, reconciling_address = start_gateway(
        binary, server.server_address[1], workdir, "reconciling", RECONCILE)
    stripe.api_key = "sk_test_idemgate"
    stripe.api_base = f"http://{address}"
    stripe.max_network_retries = 3
    results = []
    try:
        # 1. Executed, then the connection died: never charged twice.
        API.plan["lost"] = ["drop"]
        error = None
        try:
            stripe.Charge.create(amount=1000, currency="usd", idempotency_key="lost-1")
        except stripe.APIError as e:
            error = e
        runs = API.executed["lost-1"]
        results.append(check(
            "answer lost after the charge",
            len(runs) == 1 and error is not None and error.http_status == 502
            and "outcome-unknown" in str(error.json_body),
            f"the API executed it {len(runs)} time(s); the SDK retried and gave up with "
            f"HTTP {getattr(error, 'http_status', None)} "
            f"{(error.json_body or {}).get('type', '') if error else ''}"))

        # 2. A 500, then success: the SDK's retry runs again, as attempt 2.
        API.plan["flaky"] = ["fail"]
        charge = stripe.Charge.create(amount=2000, currency="usd", idempotency_key="flaky-1")
        runs = API.executed["flaky-1"]
        results.append(check(
            "500 then success",
            runs == ["1", "2"] and charge["amount"] == 2000,
            f"attempts seen by the API: {runs}; charge {charge['id']}"))

        # 3. The caller retries a finished charge: the same charge comes back.
        first = stripe.Charge.create(amount=3000, currency="usd", idempotency_key="done-1")
        again = stripe.Charge.create(amount=3000, currency="usd", idempotency_key="done-1")
        runs = API.executed["done-1"]
        results.append(check(
            "retry of a finished charge",
            len(runs) == 1 and first["id"] == again["id"],
            f"executed {len(runs)} time(s); ids {first['id']} and {again['id']}"))

        # 4. Executed, then the connection died, on a route that reconciles. The gateway
        # answers the first attempt 502 outcome-unknown; the SDK retries any 5xx by itself
        # (stripe-python's _should_retry), with the same Idempotency-Key, and that retry asks
        # the lookup and gets the charge.
        API.plan["recon"] = ["drop"]
        stripe.api_base = f"http://{reconciling_address}"
        charge = stripe.Charge.create(amount=4000, currency="usd", idempotency_key="recon-1")
        made = API.charges.get((f"Bearer {stripe.api_key}", "recon-1"))
        runs = API.executed["recon-1"]
        headers = {k.lower(): v for k, v in charge.last_response.headers.items()}
        results.append(check(
            "answer lost after the charge, route reconciles",
            made is not None and charge["id"] == made["id"] and charge["amount"] == 4000
            and len(runs) == 1 and API.lookups["recon-1"] == 1
            and headers.get("idempotency-status") == "reconciled",
            f"the API executed it {len(runs)} time(s), was asked "
            f"{API.lookups['recon-1']} lookup(s); "
            f"the SDK got {charge['id']} (the API made {made['id'] if made else None}), "
            f"Idempotency-Status: {headers.get('idempotency-status')}"))
    finally:
        for proc in (gateway, reconciling):
            proc.terminate()
            proc.wait(timeout=10)
        server.shutdown()
    passed = sum(results)
    print(f"sdk-check: {passed} passed, {len(results) - passed} failed")
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
