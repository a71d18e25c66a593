"""The OpenAPI commands against real tools (run by scripts/openapi-check).

Usage: openapi_check.py IDEMGATE REDOCLY OPENAPI_PYTHON_CLIENT

1. `idemgate routes --from-openapi` on the payments document: a configuration that
   `idemgate check` accepts, whose coverage report names the two unsafe operations left out.
2. `idemgate openapi --spec`: the merged document validates with Redocly's OpenAPI ruleset.
3. `idemgate openapi --spec --overlay`: a valid Overlay (Redocly lints it), which Redocly
   applies to the document to give exactly the merged document.
4. A client generated from the merged document by openapi-python-client: its create-payment
   function takes `idempotency_key` and sends it; against the gateway in front of a fake
   payments API, a retry gets the first payment (the API ran it once), and a reused key with
   another body comes back parsed as the gateway's problem document (422).
"""

import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

IDEMGATE, REDOCLY, GENERATOR = sys.argv[1:4]
ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "tests/openapi/fixtures/payments.yaml"
WORK = Path(tempfile.mkdtemp(prefix="openapi-check-"))


def run(*args, ok=True):
    done = subprocess.run(args, capture_output=True, text=True, cwd=WORK)
    if ok and done.returncode != 0:
        sys.exit(f"FAIL: {' '.join(map(str, args))} exited {done.returncode}\n{done.stdout}\n{done.stderr}")
    return done


def check(condition, what):
    if not condition:
        sys.exit(f"FAIL: {what}")
    print(f"ok: {what}")


# ---- 1. routes from the document ----
routes = run(IDEMGATE, "routes", "--from-openapi", DOC).stdout
executed = []


class Payments(BaseHTTPRequestHandler):
    """The fake payments API: creates a payment per request that reaches it, and counts it."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        executed.append((self.path, self.headers.get("Idempotency-Key")))
        payment = {"id": f"pay_{len(executed)}", "amount": body.get("amount", 0), "amount_refunded": 0,
                   "currency": body.get("currency", "usd"), "status": "succeeded", "created": 1700000000}
        data = json.dumps(payment).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


upstream = ThreadingHTTPServer(("127.0.0.1", 0), Payments)
threading.Thread(target=upstream.serve_forever, daemon=True).start()
config = (routes.replace('listen = "127.0.0.1:8080"', 'listen = "127.0.0.1:0"')
          .replace('admin_listen = "127.0.0.1:9090"', 'admin_listen = "127.0.0.1:0"')
          .replace('backend = "redis"\nurl = "redis://127.0.0.1:6379"', 'backend = "memory"')
          .replace('url = "http://127.0.0.1:3000"', f'url = "http://127.0.0.1:{upstream.server_port}"'))
(WORK / "gateway.toml").write_text(config)
coverage = run(IDEMGATE, "check", "--config", "gateway.toml", "--openapi", DOC).stdout
check("3 of 5 unsafe operations (POST, PATCH) protected" in coverage, "check accepts the routes; coverage: 3 of 5")
check("capture.post: POST /v1/payments/{payment_id}/capture reaches route \"passthrough\"" in coverage
      and "{customer_id}.patch: PATCH" in coverage, "coverage names the capture and the customer update")

# ---- 2. the merged document validates ----
(WORK / "merged.yaml").write_text(run(IDEMGATE, "openapi", "--config", "gateway.toml", "--spec", DOC).stdout)
run(REDOCLY, "lint", "--extends=spec", "merged.yaml")
print("ok: the merged document validates (redocly lint --extends=spec)")

# ---- 3. the overlay: valid, and applied by Redocly it gives the merged document ----
overlay = run(IDEMGATE, "openapi", "--config", "gateway.toml", "--spec", DOC, "--overlay").stdout
(WORK / "overlay.yaml").write_text(overlay)
run(REDOCLY, "lint", "overlay.yaml")
run(REDOCLY, "bundle", DOC, "--overlay", "overlay.yaml", "-o", "applied.json")
merged_json = json.loads(run(IDEMGATE, "openapi", "--config", "gateway.toml", "--spec", DOC, "--json").stdout)
applied = json.loads((WORK / "applied.json").read_text())
check(applied == merged_json, "Redocly applying the overlay gives exactly the merged document")

# ---- 4. a generated client, against the gateway ----
(WORK / "generator.yaml").write_text("post_hooks: []\n")
run(GENERATOR, "generate", "--path", "merged.yaml", "--output-path", "client/payments_client", "--meta", "none",
    "--config", "generator.yaml", "--fail-on-warning")
create = (WORK / "client/payments_client/api/payments/create_payment.py").read_text()
check(re.search(r"idempotency_key: str\b", create) is not None, "the generated create_payment takes idempotency_key")
check('"Idempotency-Key"' in create and ("HTTPStatus.UNPROCESSABLE_ENTITY" in create or "== 422" in create),
      "it sends the header and knows the gateway's 422")
sys.path.insert(0, str(WORK / "client"))
client_mod = importlib.import_module("payments_client")
api = importlib.import_module("payments_client.api.payments.create_payment")
models = importlib.import_module("payments_client.models")

gateway = subprocess.Popen([IDEMGATE, "--config", "gateway.toml"], cwd=WORK, stdout=subprocess.PIPE,
                           stderr=subprocess.DEVNULL, text=True, env={**os.environ, "RUST_LOG": "warn"})
try:
    line = gateway.stdout.readline()
    proxy = re.search(r"proxy=(\S+)", line)
    if proxy is None:
        sys.exit(f"FAIL: the gateway did not start: {line}")
    client = client_mod.Client(base_url=f"http://{proxy.group(1)}/v1", headers={"X-Api-Key": "sk_test_1"})
    key = str(uuid.uuid4())
    body = models.PaymentCreate(amount=2500, currency="usd", payment_method="pm_card_visa")
    first = api.sync_detailed(client=client, body=body, idempotency_key=key)
    again = api.sync_detailed(client=client, body=body, idempotency_key=key)
    check(int(first.status_code) == 201 and isinstance(first.parsed, models.Payment), "the first call creates a payment")
    check(int(again.status_code) == 201 and again.headers.get("idempotent-replay") == "true"
          and again.parsed.id == first.parsed.id, "the retry gets the same payment, marked Idempotent-Replay")
    other = models.PaymentCreate(amount=9999, currency="usd", payment_method="pm_card_visa")
    reused = api.sync_detailed(client=client, body=other, idempotency_key=key)
    problem = type(reused.parsed).__name__
    check(int(reused.status_code) == 422 and problem == "IdempotencyProblem"
          and reused.parsed.type_.endswith("#key-reused"), f"a reused key is read as the gateway's problem ({problem})")
    ran = [e for e in executed if e[0] == "/v1/payments"]
    check(ran == [("/v1/payments", key)], f"the payments API ran the payment once, with the key: {ran}")
finally:
    gateway.terminate()
    gateway.wait(10)
print("openapi-check: all passed")
