"""What a real payment SDK sees through the gateway.

The official Stripe Python SDK sends `Idempotency-Key` on every POST and retries by itself
(on connection errors, 409 and 5xx). It is pointed at the gateway, in front of a fake payments
API on loopback that counts every charge it executes and can look a charge up by caller and
key (`GET /v1/charges/lookup`, Idempotency-Key and Authorization headers). The gateway's own
errors are problem+json on the first two gateways and Stripe's envelope on the third
(STRIPE_ERRORS, the recipe of docs/errors.md); a fourth only observes (`mode = "observe"`).
Nine cases:

1. the API executes the charge and the connection dies before the answer: the SDK retries
   with the same key, and the charge must not be made twice;
2. the API answers 500 once, then succeeds: the SDK's retry runs again (attempt 2) and
   succeeds;
3. the caller retries a finished charge with the same key: the stored charge comes back;
4. as 1, through a second gateway whose route reconciles (`[routes.idempotency.reconcile]`
   with the lookup): the SDK's own retry of the 502 gets the charge the API made, marked
   `Idempotency-Status: reconciled`, and the charge is still made once;
5. the caller sends a key again with another amount, problem+json: the SDK cannot read the
   gateway's answer and raises a generic APIError ("Invalid response object"), the contrast
   to 6;
6. as 5, through the Stripe-shaped gateway: the SDK raises IdempotencyError (400
   idempotency_error), and the charge is made once;
7. a duplicate while the first charge is still running, through the Stripe-shaped gateway:
   the gateway's short `wait` ends in 409 idempotency_key_in_use, which the SDK retries by
   itself until it gets the first one's charge, and the charge is made once;
8. as 1, through the Stripe-shaped gateway: `Stripe-Should-Retry: false` on outcome-unknown,
   so the SDK does not retry what cannot succeed and raises the 502 at once;
9. through the observing gateway: the SDK gets the API's own answers (a retried charge runs
   again, with no attempt header), and the gateway counts what enforcing would have done.

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
import time
import urllib.request
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
        self.slow = 1.5  # seconds a "slow" execution takes

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
        if behaviour == "slow":
            time.sleep(API.slow)
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
{idempotency}
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


# The gateway's errors in Stripe's envelope, for the whole file: key reuse is Stripe's 400
# idempotency_error (IdempotencyError in the SDKs), a running duplicate is its 409
# idempotency_key_in_use (which the SDKs retry), and outcome-unknown tells the SDK not to retry
# (nothing reconciles it on this gateway, so a retry would only get the same 502).
STRIPE_ERRORS = """
[errors]
content_type = "application/json"
body = '{"error": {"type": "api_error", "code": "{type}", "message": "{detail}", "doc_url": "{type_uri}"}}'

[errors.key-reused]
status = 400
body = '{"error": {"type": "idempotency_error", "message": "{detail}"}}'

[errors.in-progress]
body = '{"error": {"type": "idempotency_error", "code": "idempotency_key_in_use", "message": "{detail}"}}'

[errors.outcome-unknown]
headers = { "Stripe-Should-Retry" = "false" }
"""

# A duplicate waits this long for the first request, well short of a "slow" execution, so
# that it gets 409 in-progress while the first still runs.
SHORT_WAIT = 'wait = "200ms"\n'


class Recorder(stripe.RequestsClient):
    """The SDK's own HTTP client, noting every answer it got (retries included), per key."""

    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()
        self.answers = defaultdict(list)  # key -> [(status, body, headers)]

    def request(self, method, url, headers, post_data=None):
        content, status, rheaders = super().request(method, url, headers, post_data)
        key = {k.lower(): v for k, v in (headers or {}).items()}.get("idempotency-key", "")
        body = content.decode() if isinstance(content, bytes) else content
        with self.lock:
            self.answers[key].append((status, body, {k.lower(): v for k, v in rheaders.items()}))
        return content, status, rheaders


def error_doc(body):
    try:
        return json.loads(body).get("error") or {}
    except (ValueError, AttributeError):
        return {}


def start_gateway(binary, api_port, workdir, name, idempotency="", errors=""):
    path = os.path.join(workdir, f"{name}.toml")
    with open(path, "w") as f:
        # The error templates are full of braces: added after the format, not through it.
        f.write(CONFIG.format(port=api_port, idempotency=idempotency) + errors)
    log = os.path.join(workdir, f"{name}.log")
    proc = subprocess.Popen([binary, "--config", path], stdout=subprocess.PIPE,
                            stderr=open(log, "w"), text=True)
    line = proc.stdout.readline()
    match = re.search(r"proxy=(\S+) admin=(\S+)", line)
    if not match:
        proc.kill()
        sys.exit(f"the gateway did not start: {line!r}; see {log}")
    ADMIN[name] = match.group(2)
    return proc, match.group(1)


# Each gateway's admin listener, by name.
ADMIN = {}


def observed(name, route, would):
    """idemgate_observed_total{route, would} of the gateway `name`."""
    text = urllib.request.urlopen(f"http://{ADMIN[name]}/metrics", timeout=10).read().decode()
    series = f'idemgate_observed_total{{route="{route}",would="{would}"}} '
    return next((int(float(line[len(series):])) for line in text.splitlines() if line.startswith(series)), None)


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
    shaped, shaped_address = start_gateway(
        binary, server.server_address[1], workdir, "stripe-shaped", SHORT_WAIT, STRIPE_ERRORS)
    observing, observing_address = start_gateway(
        binary, server.server_address[1], workdir, "observing", 'mode = "observe"\n')
    recorder = Recorder()
    stripe.default_http_client = recorder
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
        sent = len(recorder.answers["lost-1"])
        results.append(check(
            "answer lost after the charge",
            len(runs) == 1 and error is not None and error.http_status == 502
            and "outcome-unknown" in str(error.json_body) and sent > 1,
            f"the API executed it {len(runs)} time(s); the SDK sent it {sent} time(s) and gave up with "
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

        # 5. A key sent again with another amount, problem+json: the SDK looks for Stripe's
        # "error" member, finds none, and can only say the answer is not one of Stripe's.
        stripe.api_base = f"http://{address}"
        first = stripe.Charge.create(amount=5000, currency="usd", idempotency_key="plain-reuse-1")
        error = None
        try:
            stripe.Charge.create(amount=5100, currency="usd", idempotency_key="plain-reuse-1")
        except stripe.StripeError as e:
            error = e
        runs = API.executed["plain-reuse-1"]
        results.append(check(
            "key reused, problem+json (before the recipe)",
            type(error) is stripe.APIError and error.http_status == 422
            and "Invalid response object" in str(error) and len(runs) == 1,
            f"the SDK raised {type(error).__name__} HTTP {getattr(error, 'http_status', None)} "
            f"{str(error).split(':')[0]!r}; executed {len(runs)} time(s)"))

        # 6. The same through the Stripe-shaped gateway: IdempotencyError, as from Stripe.
        stripe.api_base = f"http://{shaped_address}"
        first = stripe.Charge.create(amount=6000, currency="usd", idempotency_key="reuse-1")
        error = None
        try:
            stripe.Charge.create(amount=6100, currency="usd", idempotency_key="reuse-1")
        except stripe.StripeError as e:
            error = e
        runs = API.executed["reuse-1"]
        results.append(check(
            "key reused, Stripe-shaped",
            isinstance(error, stripe.IdempotencyError) and not isinstance(error, stripe.APIError)
            and error.http_status == 400 and first["amount"] == 6000 and len(runs) == 1,
            f"first charge {first['id']}; the reuse raised {type(error).__name__} "
            f"HTTP {getattr(error, 'http_status', None)}: {getattr(error, 'user_message', None)!r}; "
            f"executed {len(runs)} time(s)"))

        # 7. A duplicate while the first still runs (for API.slow seconds). The gateway holds it
        # for its 200ms wait, then answers 409 idempotency_key_in_use; the SDK retries any 409
        # by itself (stripe-python's _should_retry), with the same key, until the first has
        # finished and its charge comes back.
        API.plan["slow"] = ["slow"]
        outcome = {}

        def first_create():
            try:
                outcome["charge"] = stripe.Charge.create(
                    amount=7000, currency="usd", idempotency_key="slow-1")
            except Exception as e:  # reported below
                outcome["error"] = e

        thread = threading.Thread(target=first_create)
        thread.start()
        deadline = time.monotonic() + 5
        while not API.executed["slow-1"] and time.monotonic() < deadline:
            time.sleep(0.01)  # until the first is running at the API
        duplicate, error = None, None
        try:
            duplicate = stripe.Charge.create(amount=7000, currency="usd", idempotency_key="slow-1",
                                             max_network_retries=4)
        except stripe.StripeError as e:
            error = e
        thread.join(timeout=10)
        charge = outcome.get("charge")
        runs = API.executed["slow-1"]
        statuses = [status for status, _, _ in recorder.answers["slow-1"]]
        in_use = [error_doc(body).get("code") for status, body, _ in recorder.answers["slow-1"]
                  if status == 409]
        results.append(check(
            "duplicate while the first runs, Stripe-shaped",
            charge is not None and duplicate is not None and duplicate["id"] == charge["id"]
            and in_use and all(code == "idempotency_key_in_use" for code in in_use)
            and len(runs) == 1,
            f"the first got {charge['id'] if charge else outcome.get('error')}, the duplicate got "
            f"{duplicate['id'] if duplicate else repr(error)}, retrying by itself after "
            f"{len(in_use)} x 409 {in_use[0] if in_use else None} (answers to both: {statuses}); "
            f"executed {len(runs)} time(s)"))

        # 8. Executed, then the connection died, through the Stripe-shaped gateway, whose route
        # does not reconcile: Stripe-Should-Retry: false, and the SDK raises the 502 at once.
        API.plan["shaped-lost"] = ["drop"]
        error = None
        try:
            stripe.Charge.create(amount=8000, currency="usd", idempotency_key="shaped-lost-1")
        except stripe.StripeError as e:
            error = e
        runs = API.executed["shaped-lost-1"]
        answers = recorder.answers["shaped-lost-1"]
        results.append(check(
            "answer lost after the charge, Stripe-shaped",
            isinstance(error, stripe.APIError) and error.http_status == 502
            and error_doc(error.http_body).get("code") == "outcome-unknown"
            and [status for status, _, _ in answers] == [502]
            and answers[0][2].get("stripe-should-retry") == "false" and len(runs) == 1,
            f"the API executed it {len(runs)} time(s); the SDK sent {len(answers)} request(s) "
            f"(Stripe-Should-Retry: {answers[0][2].get('stripe-should-retry') if answers else None}) "
            f"and raised {type(error).__name__} HTTP {getattr(error, 'http_status', None)} "
            f"{error_doc(getattr(error, 'http_body', None)).get('code')}"))

        # 9. A route that only observes: the SDK sees the API's own answers. A 500 then
        # success runs twice, as through no gateway, without an attempt header; the caller's
        # retry of a finished charge runs again (a second charge), and the gateway counts
        # both what enforcing would have replayed and that the API answered it differently.
        stripe.api_base = f"http://{observing_address}"
        API.plan["watched-flaky"] = ["fail"]
        charge = stripe.Charge.create(amount=9000, currency="usd", idempotency_key="watched-flaky-1")
        first = stripe.Charge.create(amount=9100, currency="usd", idempotency_key="watched-done-1")
        again = stripe.Charge.create(amount=9100, currency="usd", idempotency_key="watched-done-1")
        flaky, done = API.executed["watched-flaky-1"], API.executed["watched-done-1"]
        headers = {k.lower(): v for k, v in again.last_response.headers.items()}
        counts = {w: observed("observing", "charges", w)
                  for w in ("first", "would_replay", "answer_differed")}
        results.append(check(
            "a route that only observes",
            flaky == [None, None] and charge["amount"] == 9000 and len(done) == 2
            and first["id"] != again["id"] and "idempotent-replay" not in headers
            and counts == {"first": 3, "would_replay": 1, "answer_differed": 1},
            f"the API ran the flaky charge {len(flaky)} time(s) (attempt headers {flaky}) and the "
            f"retried one {len(done)} time(s) ({first['id']}, then {again['id']}); the gateway "
            f"counted {counts}"))
    finally:
        for proc in (gateway, reconciling, shaped, observing):
            proc.terminate()
            proc.wait(timeout=10)
        server.shutdown()
    passed = sum(results)
    print(f"sdk-check: {passed} passed, {len(results) - passed} failed")
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
