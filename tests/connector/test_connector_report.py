"""The connector's report: typed at both ends, a dict of JSON values on vLLM's wire."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from inferscale_memory.connector.params import PARAMS_KEY, FactKey
from inferscale_memory.connector.report import ConnectorReport, ReportError
from inferscale_memory.errors import EngineError

keys = st.lists(st.builds(FactKey, st.text(max_size=8), st.text(max_size=8)),
                max_size=4).map(tuple)
counts = st.none() | st.integers(min_value=0, max_value=2**40)
reports = st.builds(
    ConnectorReport, captured=keys, injected_tokens=st.integers(min_value=0, max_value=2**40),
    missing=keys, evicted=keys, demoted=keys, promoted=keys, deleted=keys,
    pool_tokens=counts, budget_tokens=counts, host_tokens=counts, host_budget_tokens=counts,
    error=st.none() | st.text(min_size=1, max_size=20))


@given(reports)
def test_every_report_survives_the_wire(report: ConnectorReport) -> None:
    wire = json.loads(json.dumps(report.to_output()))  # JSON values only
    assert ConnectorReport.from_output(wire) == report


def test_the_wire_body_leaves_out_what_is_empty() -> None:
    a, header = FactKey("alice", "fa"), FactKey("", "header:L1")
    assert ConnectorReport().to_dict() == {"captured": [], "injected_tokens": 0, "missing": []}
    report = ConnectorReport(captured=(header,), injected_tokens=8, missing=(a,),
                             evicted=(a,), pool_tokens=18, budget_tokens=100)
    assert report.to_output() == {PARAMS_KEY: {
        "captured": [["", "header:L1"]], "injected_tokens": 8, "missing": [["alice", "fa"]],
        "evicted": [["alice", "fa"]], "pool_tokens": 18, "budget_tokens": 100}}


def test_an_output_without_a_report_reads_as_an_empty_one() -> None:
    for params in (None, {}, {"other_connector": {"x": 1}}, {PARAMS_KEY: None}):
        assert ConnectorReport.from_output(params) == ConnectorReport()


@pytest.mark.parametrize(("body", "names"), [
    ([["alice", "fa"]], "mapping"),
    ({"injected": 3}, "unknown connector report fields ['injected']"),
    ({"injected_tokens": "3"}, "'injected_tokens' must be a count"),
    ({"injected_tokens": None}, "'injected_tokens' must be a count"),
    ({"pool_tokens": -1}, "'pool_tokens' must be a count"),
    ({"host_tokens": True}, "'host_tokens' must be a count"),
    ({"missing": "alice/fa"}, "'missing' must be a list"),
    ({"captured": [["alice"]]}, "'captured' holds ['alice']"),
    ({"evicted": [["alice", 3]]}, "'evicted' holds ['alice', 3]"),
    ({"error": ["bad"]}, "'error' must be a string"),
])
def test_a_malformed_report_is_refused_naming_its_field(body: Any, names: str) -> None:
    with pytest.raises(ReportError, match="connector report") as info:
        ConnectorReport.from_output({PARAMS_KEY: body})
    assert names in str(info.value)
    assert isinstance(info.value, EngineError)  # a caller's `except EngineError` sees it


def test_the_report_crosses_vllms_process_boundary() -> None:
    """The engine core sends a finished request's ``kv_transfer_params`` to the front end
    in an ``EngineCoreOutputs`` encoded by vLLM's own msgpack encoder."""
    pytest.importorskip("vllm")
    from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder

    report = ConnectorReport(captured=(FactKey("", "header:L1"),), injected_tokens=20,
                             missing=(FactKey("alice", "fb"),), demoted=(FactKey("bob", "x"),),
                             host_tokens=12, host_budget_tokens=30, error="cut")
    outputs = EngineCoreOutputs(outputs=[EngineCoreOutput(
        request_id="r", new_token_ids=[1], kv_transfer_params=report.to_output())])
    frames = MsgpackEncoder().encode(outputs)
    received = MsgpackDecoder(EngineCoreOutputs).decode(frames)
    assert ConnectorReport.from_output(received.outputs[0].kv_transfer_params) == report
