"""The server fuzzed through its own OpenAPI description (schemathesis on loopback, bounded):
requests generated from the documented schemas, valid and invalid, get no 5xx, answers of the
documented status codes and content types; afterwards no sequence is left running or waiting."""

import collections

import pytest

schemathesis = pytest.importorskip("schemathesis")
pytest.importorskip("starlette")

from hypothesis import HealthCheck, settings  # noqa: E402

from qlinear.llm.serve import openapi  # noqa: E402
from test_serve import NAME, checkpoint, load, running_server, wait_until  # noqa: E402,F401  (checkpoint: a fixture)

EXAMPLES = 500  # per operation and generation mode: thousands of requests in all
schema = schemathesis.openapi.from_dict(openapi.document(NAME))
for config in (schema.config.generation, schema.config.phases.fuzzing.generation):  # valid and invalid requests
    config.update(max_examples=EXAMPLES, deterministic=True)
SENT = collections.Counter()  # requests by (operation, status)


@pytest.fixture(scope="module")
def fuzzed(checkpoint):
    """A server of a small context (generations stay short whatever max_tokens says)."""
    with running_server(load(checkpoint, max_context=48), max_batch=4, max_queue=8) as (url, app):
        yield url, app
        scheduler = app.state.scheduler
        wait_until(lambda: scheduler.running == 0 and scheduler.waiting == 0, "a sequence was left behind")
    generated = sum(n for (op, status), n in SENT.items() if op.startswith("POST") and status == 200)
    print(f"fuzzing: {sum(SENT.values())} requests, {generated} generations answered; by status: "
          f"{dict(collections.Counter(status for _, status in SENT.elements()))}")


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_documented_api_holds_under_fuzzing(case, fuzzed):
    url, app = fuzzed
    response = case.call(base_url=url, timeout=30)
    SENT[case.operation.label, response.status_code] += 1
    assert response.status_code < 500, (response.status_code, response.text[:300])
    case.validate_response(response, excluded_checks=[schemathesis.checks.positive_data_acceptance])
    if response.status_code >= 400:
        error = response.json()["error"]
        assert error["message"] and error["type"]
