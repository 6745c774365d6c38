"""The frontend's endpoint table and its OpenAPI document name the same paths and methods, so a
new endpoint cannot be served undocumented (nor documented and not served)."""

from __future__ import annotations

from dyn.core.frontend.endpoints import ENDPOINTS
from dyn.core.frontend.openapi import openapi_document


def test_the_document_describes_every_endpoint_with_its_method():
    paths = openapi_document("m", context_length=128, vocab_size=64)["paths"]
    served = {path: endpoint.methods[0].lower() for path, endpoint in ENDPOINTS.items()}
    documented = {
        # a path with a parameter is served by the prefix endpoint above it (``Endpoint.prefix``)
        path.split("{", 1)[0]: next(iter(item))
        for path, item in paths.items()
    }
    assert all(ENDPOINTS[path].prefix for path in documented if path.endswith("/"))
    assert served.pop("/openapi.json") == "get"  # the document does not describe itself
    assert served == documented


def test_generate_endpoints_label_their_metrics_as_dynamo_does():
    assert ENDPOINTS["/v1/chat/completions"].label == "chat_completions"
    assert ENDPOINTS["/v1/completions"].label == "completions"
