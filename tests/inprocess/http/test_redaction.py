"""The webhook and the tracing endpoint shown by GET /admin/policy (and in the audit's policy changes) as scheme,
host and port only, by one function (admin.redact_endpoint): whatever secret sits in the userinfo, the path, the
query or the fragment, with or without a scheme, never shows."""

from __future__ import annotations

import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.http import admin
from gateway.policy.schema import Policy
from tests.conftest import policy_dict

SECRET = st.text(string.ascii_letters + string.digits + "-_.~", min_size=12, max_size=40)
HOST = st.sampled_from(["collector", "api.honeycomb.io", "10.0.0.7", "[2001:db8::5]", "otel.example.com"])
PORT = st.none() | st.integers(1, 65535)


@pytest.mark.parametrize("given_url,shown", [
    ("https://api.honeycomb.io?x-honeycomb-team=S3CRET", "https://api.honeycomb.io/<redacted>"),
    ("https://collector:4318/v1/traces?code=S3CRET", "https://collector:4318/<redacted>"),
    ("https://collector/S3CRET-TOKEN/v1/traces", "https://collector/<redacted>"),
    ("https://collector:4318#S3CRET", "https://collector:4318/<redacted>"),
    ("user:S3CRET@collector:4317", "<redacted>@collector:4317"),
    ("S3CRET@collector", "<redacted>@collector"),
    ("collector:4317", "collector:4317"),
    ("http://otel-collector:4318", "http://otel-collector:4318"),
    ("http://otel-collector:4318/", "http://otel-collector:4318"),
    ("https://user:S3CRET@[2001:db8::1]:4318/x", "https://<redacted>@[2001:db8::1]:4318/<redacted>"),
    ("https://collector:99999/S3CRET", "<redacted>"),  # a port out of range does not parse: nothing shown
    ("https://:S3CRET@/x", "<redacted>"),  # no host
    (None, None),
])
def test_an_endpoint_shows_its_scheme_and_host_only(given_url: str | None, shown: str | None) -> None:
    assert admin.redact_endpoint(given_url) == shown


@settings(max_examples=300, deadline=None)
@given(scheme=st.sampled_from(["http://", "https://", ""]), host=HOST, port=PORT, secret=SECRET,
       where=st.sampled_from(["user", "password", "path", "query", "fragment", "query-name"]))
def test_no_secret_survives_wherever_it_sits(scheme: str, host: str, port: int | None, secret: str,
                                             where: str) -> None:
    hostport = host + (f":{port}" if port is not None else "")
    url = {"user": f"{scheme}{secret}@{hostport}", "password": f"{scheme}svc:{secret}@{hostport}",
           "path": f"{scheme}{hostport}/v1/{secret}/traces", "query": f"{scheme}{hostport}/v1?code={secret}",
           "fragment": f"{scheme}{hostport}#{secret}", "query-name": f"{scheme}{hostport}?{secret}=1"}[where]
    shown = admin.redact_endpoint(url)
    assert shown is not None and secret not in shown
    assert shown.startswith(scheme), "the scheme stays"
    assert hostport in shown, "the host and port stay"
    assert shown in (f"{scheme}{hostport}/<redacted>", f"{scheme}<redacted>@{hostport}")


def test_get_admin_policy_redacts_the_tracing_endpoint_as_the_webhook() -> None:
    policy = policy_dict(["http://127.0.0.1:9"])
    policy["tracing"] = {"endpoint": "https://svc:PW-S3CRET@api.honeycomb.io/T0KEN-S3CRET?x-honeycomb-team=K-S3CRET"}
    policy["spend"] = {"webhook_url": "https://hooks.slack.com/services/T0/B0/W-S3CRET"}
    shown = admin.redacted(Policy.model_validate(policy))
    assert shown["tracing"]["endpoint"] == "https://<redacted>@api.honeycomb.io/<redacted>"
    assert shown["spend"]["webhook_url"] == "https://hooks.slack.com/<redacted>"
    assert "S3CRET" not in str(shown)
