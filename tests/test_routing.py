"""Cost routing in `plan`: each route's cost and duration from known counts and prices, the pick under a
deadline and a budget, routes of other vectors flagged, and what `plan` prints and exits with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from reindex import registry
from reindex.config import RouteConfig, RunConfig
from reindex.plan import routing
from reindex.plan.estimate import PlanReport
from reindex.ui.cli import app
from reindex_adapters.remote.tokens import encoding
from reindex_adapters.testing.memory import HashEmbedder
from tests.cli.test_terminal import readable

runner = CliRunner()
ONLINE = {
    "kind": "openai",
    "model": "text-embedding-3-small",
    "tokens_per_minute": 1_000_000,
    "requests_per_minute": 3_000,
}
BATCH = {"kind": "openai-batch", "model": "text-embedding-3-small"}


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building an OpenAI embedder reads its key; `plan` never sends a request."""
    monkeypatch.setenv("OPENAI_API_KEY", "unused")


def priced(run: RunConfig) -> tuple[list[routing.Route], dict[str, Any]]:
    """Three routes over 1M documents, 900k distinct texts, 100M tokens (text-embedding-3-small's list prices:
    $0.02 online, $0.01 batch per 1M): online, batch, and another model on 2 GPUs at 1,000 documents/s each."""
    online = registry.build("embedder", ONLINE)
    report = PlanReport(
        documents=1_000_000,
        unique_texts=900_000,
        tokens=100_000_000,
        fingerprint=online.info.fingerprint,
        model=online.info.describe(),
    )
    candidates = [
        routing.Candidate(RouteConfig(name=routing.CONFIGURED), ONLINE, online),
        routing.Candidate(RouteConfig(name="batch"), BATCH, registry.build("embedder", BATCH)),
        routing.Candidate(
            RouteConfig(name="gpu", gpu_hour_usd=4.0, gpus=2, docs_per_second=1_000),
            {"kind": "hash"},
            HashEmbedder(),
        ),
    ]
    routes = routing.price(report, run, candidates, {})
    return routes, routing.choose(routes, run)


def by_name(routes: list[routing.Route]) -> dict[str, routing.Route]:
    return {route.name: route for route in routes}


def test_each_route_is_priced_and_timed_from_the_counts(key: None) -> None:
    routes = by_name(priced(RunConfig())[0])
    online, batch, gpu = routes["[embedder]"], routes["batch"], routes["gpu"]
    assert (online.tier, online.cost_usd, online.price_per_million_usd) == ("online", 2.0, 0.02)
    # 100M tokens at 98% of 1M tokens/min; the 440 requests (900k texts / 2,048) at 3,000/min take 9 s
    assert online.duration_seconds == pytest.approx(100_000_000 * 60 / 980_000, abs=0.1)
    assert (batch.tier, batch.cost_usd, batch.duration_seconds) == ("batch", 1.0, 24 * 3600)
    assert "whole 24 h window" in " ".join(batch.risks)
    assert (gpu.tier, gpu.duration_seconds) == ("self-hosted", 500.0)  # 1M / (1,000/s x 2 GPUs)
    assert gpu.cost_usd == pytest.approx(500 / 3600 * 4.0 * 2, abs=1e-6)
    assert online.same_vectors and batch.same_vectors and online.fingerprint == batch.fingerprint


def test_another_model_is_flagged_and_never_picked_however_cheap(key: None) -> None:
    routes, pick = priced(RunConfig())
    gpu = by_name(routes)["gpu"]
    assert gpu.same_vectors is False and gpu.fits is False
    assert gpu.failures == ["other vectors (another model or options)"]
    assert "another migration" in " ".join(gpu.risks)
    assert pick["name"] == "batch"  # the cheapest way to the configured vectors, though gpu is cheaper still


def test_a_deadline_counts_the_whole_batch_window(key: None) -> None:
    routes, pick = priced(RunConfig(deadline="6h"))
    assert pick["name"] == "[embedder]" and pick["deadline_seconds"] == 6 * 3600
    assert by_name(routes)["batch"].failures == ["deadline: 24 h 00 min (its whole batch window) > 6h"]
    assert "batch costs less ($1.00) but fails: deadline" in pick["reason"]


def test_a_budget_rules_out_the_online_tier(key: None) -> None:
    routes, pick = priced(RunConfig(max_cost_usd=1.5))
    assert pick["name"] == "batch" and pick["cost_usd"] == 1.0
    assert by_name(routes)["[embedder]"].failures == ["budget: $2.00 > max_cost_usd $1.50"]


def test_a_deadline_and_a_budget_together(key: None) -> None:
    _, pick = priced(RunConfig(deadline="2d", max_cost_usd=1.5))
    assert pick["name"] == "batch" and "the deadline 2d and max_cost_usd $1.50" in pick["reason"]


def test_no_route_meeting_both_names_each_failure(key: None) -> None:
    routes, pick = priced(RunConfig(deadline="6h", max_cost_usd=1.5))
    assert pick["name"] is None and pick["cost_usd"] is None
    assert all(not route.fits for route in routes)
    assert "[embedder]: budget: $2.00 > max_cost_usd $1.50" in pick["reason"]
    assert "batch: deadline: 24 h 00 min (its whole batch window) > 6h" in pick["reason"]


def test_an_online_tier_without_rate_limits_has_no_duration(key: None) -> None:
    online = registry.build("embedder", {"kind": "openai", "model": "text-embedding-3-small"})
    report = PlanReport(documents=10, unique_texts=10, tokens=1_000, fingerprint=online.info.fingerprint)
    route = routing.Candidate(RouteConfig(name=routing.CONFIGURED), {"kind": "openai"}, online)
    [priced_route] = routing.price(report, RunConfig(deadline="1h"), [route], {})
    assert priced_route.duration_seconds is None and priced_route.duration_basis.startswith("unknown")
    assert priced_route.failures == ["deadline: duration unknown"]


# through the CLI ----------------------------------------------------------------------------------------


def write_setup(tmp_path: Path, run: str, routes: str) -> tuple[Path, list[str]]:
    texts = [f"document {i} about topic {i % 7} " + "word " * (i % 12) for i in range(300)]
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i:03d}", "text": t}) + "\n" for i, t in enumerate(texts)))
    config = tmp_path / "docs.toml"
    config.write_text(
        f'[source]\nkind = "jsonl"\npath = "{corpus}"\n\n[embedder]\nkind = "hash"\ndim = 16\n\n'
        f'[target]\nkind = "memory"\nalias = "docs"\n\n[run]\nstate = "{tmp_path / "state.db"}"\n{run}\n\n'
        + routes
    )
    return config, texts


GPU_AND_OPENAI = """
[[routes]]
name = "gpu"
gpu_hour_usd = 3.6
gpus = 2
docs_per_second = 50

[[routes]]
name = "openai"
embedder = { kind = "openai", model = "text-embedding-3-small", tokens_per_minute = 60000 }
"""


def plan_json(config: Path) -> tuple[int, dict[str, Any]]:
    result = runner.invoke(app, ["plan", "-c", str(config), "--json", "--no-calibrate"])
    return result.exit_code, json.loads(result.stdout)


def test_plan_json_lists_routes_and_the_pick(tmp_path: Path, key: None) -> None:
    config, texts = write_setup(tmp_path, 'deadline = "1h"', GPU_AND_OPENAI)
    code, plan = plan_json(config)
    assert code == 0
    routes = {route["name"]: route for route in plan["routes"]}
    assert list(routes) == ["[embedder]", "gpu", "openai"]
    assert set(routes["gpu"]) >= {
        "name", "kind", "model", "tier", "fingerprint", "is_configured", "same_vectors", "tokens", "tokens_basis",
        "price_per_million_usd", "gpu_hour_usd", "gpus", "docs_per_second", "cost_usd", "cost_basis",
        "duration_seconds", "duration_basis", "risks", "failures", "fits",
    }  # fmt: skip
    assert set(plan["route"]) == {
        "name", "reason", "deadline", "deadline_seconds", "max_cost_usd", "cost_usd", "duration_seconds",
    }  # fmt: skip
    # the same model on two GPUs: 300 documents at 50/s each, 3 s, $3.60 per GPU-hour
    assert routes["gpu"]["same_vectors"] is True and routes["gpu"]["duration_seconds"] == 3.0
    assert routes["gpu"]["cost_usd"] == pytest.approx(3 / 3600 * 3.6 * 2, abs=1e-6)
    # --no-calibrate: the configured embedder has no rate here, so no duration to hold against the deadline
    assert routes["[embedder]"]["failures"] == ["deadline: duration unknown"]
    assert plan["route"]["name"] == "gpu" and plan["route"]["duration_seconds"] == 3.0
    # another model, counted with its own tokenizer (cl100k_base), not the hash embedder's words
    openai = routes["openai"]
    assert openai["same_vectors"] is False and openai["fingerprint"] != plan["fingerprint"]
    assert openai["tokens"] == sum(len(encoding().encode(text)) for text in texts) != plan["tokens"]
    assert openai["tokens_basis"] == "counted with its own tokenizer"
    assert openai["cost_usd"] == pytest.approx(openai["tokens"] * 0.02 / 1e6, abs=1e-6)


def test_plan_exits_4_with_its_json_when_no_route_meets_both(tmp_path: Path, key: None) -> None:
    config, _ = write_setup(tmp_path, 'deadline = "2s"\nmax_cost_usd = 0.001', GPU_AND_OPENAI)
    code, plan = plan_json(config)
    assert code == 4 and plan["route"]["name"] is None and plan["documents"] == 300
    failures = {route["name"]: route["failures"] for route in plan["routes"]}
    assert failures["gpu"] == ["deadline: 3.0 s > 2s", "budget: $0.0060 > max_cost_usd $0.0010"]
    assert failures["openai"][0] == "other vectors (another model or options)"
    human = runner.invoke(app, ["plan", "-c", str(config), "--no-calibrate"])
    assert human.exit_code == 4
    assert "Refused: no route meets the deadline 2s and max_cost_usd $0.0010" in human.stdout


def test_the_plan_screen_shows_the_routes_side_by_side(tmp_path: Path, key: None) -> None:
    config, _ = write_setup(tmp_path, 'deadline = "1h"', GPU_AND_OPENAI)
    result = runner.invoke(app, ["plan", "-c", str(config), "--no-calibrate"])
    assert result.exit_code == 0
    text = readable(result.stdout)
    lines = text.splitlines()
    header = lines.index("Routes") + 1
    assert lines[header].split() == ["route", "model", "tier", "cost", "duration", "fits"]
    rows = {
        line.split()[0] if not line.startswith("→") else line.split()[1]: line for line in lines[header + 1 :]
    }
    assert rows["gpu"].startswith("→ gpu") and "self-hosted" in rows["gpu"] and "about 3.0 s" in rows["gpu"]
    assert "[other vectors]" in rows["openai"] and "$0.00" in rows["openai"]
    assert "deadline: duration unknown" in rows["[embedder]"]
    assert any(line.startswith("Route: gpu, cheapest of 1 interchangeable route meeting") for line in lines)


@pytest.mark.parametrize("deadline", ["soon", "6", "6hours", "-1h", "0h"])
def test_a_malformed_deadline_exits_2_with_one_line(tmp_path: Path, deadline: str) -> None:
    config, _ = write_setup(tmp_path, f'deadline = "{deadline}"', "")
    result = runner.invoke(app, ["plan", "-c", str(config)])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: [run] deadline:") and deadline in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_route_tables_are_checked_like_the_embedder(tmp_path: Path) -> None:
    twice = '[[routes]]\nname = "a"\n\n[[routes]]\nname = "a"\n'
    unknown = '[[routes]]\nname = "a"\ngpu_hours = 1\n'
    bad_kind = '[[routes]]\nname = "a"\nembedder = { kind = "nope" }\n'
    for routes, message in (
        (twice, "[[routes]] name 'a' is used twice"),
        (unknown, "[routes.0] unknown key 'gpu_hours'"),
        (bad_kind, "unknown embedder kind 'nope'"),
    ):
        config, _ = write_setup(tmp_path, "", routes)
        result = runner.invoke(app, ["plan", "-c", str(config)])
        assert result.exit_code == 2 and message in result.stderr, result.stderr


def test_without_routes_or_limits_the_screen_has_no_route_table(tmp_path: Path) -> None:
    config, _ = write_setup(tmp_path, "", "")
    result = runner.invoke(app, ["plan", "-c", str(config), "--no-calibrate"])
    assert result.exit_code == 0 and "Routes" not in result.stdout
    code, plan = plan_json(config)
    assert code == 0 and plan["route"]["name"] == "[embedder]" and len(plan["routes"]) == 1


def test_a_route_not_built_here_counts_only_with_a_declared_fingerprint(key: None) -> None:
    online = registry.build("embedder", ONLINE)
    report = PlanReport(documents=3_600, tokens=1, fingerprint=online.info.fingerprint, model={"model": "m"})
    gpu = {"gpu_hour_usd": 2.0, "docs_per_second": 1.0}
    declared = RouteConfig(name="declared", fingerprint=online.info.fingerprint, **gpu)
    candidates = [
        routing.Candidate(
            RouteConfig(name="unknown", **gpu), {"kind": "vllm"}, None, "vllm is not installed"
        ),
        routing.Candidate(declared, {"kind": "vllm"}, None, "vllm is not installed"),
    ]
    unknown, known = routing.price(report, RunConfig(), candidates, {})
    assert unknown.same_vectors is None and unknown.failures == [
        "fingerprint unknown (not built here; declare its fingerprint)"
    ]
    assert known.same_vectors is True and known.fits and known.tier == "self-hosted"
    assert (known.duration_seconds, known.cost_usd) == (3_600.0, 2.0)
    assert "not built here: vllm is not installed (fingerprint as declared)" in known.risks
    assert known.tokens_basis == "counted with its own tokenizer"  # the same fingerprint, the same tokenizer


def test_a_route_whose_embedder_cannot_be_built_is_listed_with_why(tmp_path: Path) -> None:
    routes = (
        '[[routes]]\nname = "elsewhere"\nembedder = { kind = "openai", model = "text-embedding-3-small", '
        + ('api_key_env = "ROUTING_TEST_UNSET" }\n')
    )
    config, _ = write_setup(tmp_path, "", routes)
    code, plan = plan_json(config)
    elsewhere = plan["routes"][1]
    assert code == 0 and plan["route"]["name"] == "[embedder]"
    assert elsewhere["fingerprint"] is None and elsewhere["tier"] == "unknown" and not elsewhere["fits"]
    assert elsewhere["risks"][0].startswith("not built here: the environment variable ROUTING_TEST_UNSET")
    # not built, no fingerprint declared, another model's name: other vectors, judged by the name
    assert elsewhere["same_vectors"] is False and "judged by its model's name" in elsewhere["risks"][-1]


def test_a_batch_window_is_the_providers_own_or_the_routes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MISTRAL_API_KEY", "unused")
    section = {"kind": "mistral-batch", "timeout_hours": 48}
    mistral = registry.build("embedder", section)
    report = PlanReport(documents=10, unique_texts=10, tokens=2_000_000, fingerprint=mistral.info.fingerprint)
    own = routing.Candidate(RouteConfig(name="own"), section, mistral)
    given = routing.Candidate(RouteConfig(name="given", completion_window_hours=12), section, mistral)
    own_route, given_route = routing.price(report, RunConfig(deadline="1d"), [own, given], {})
    assert own_route.duration_seconds == 48 * 3600 and own_route.cost_usd == 0.1  # 2M tokens x $0.05/1M
    assert own_route.failures == ["deadline: 48 h 00 min (its whole batch window) > 1d"]
    assert given_route.duration_seconds == 12 * 3600 and given_route.fits


@pytest.mark.parametrize(
    ("section", "env", "texts_per_request"),
    [
        ({"kind": "cohere", "model": "embed-v4.0", "requests_per_minute": 600}, "CO_API_KEY", 96),
        ({"kind": "voyage", "model": "voyage-3.5", "requests_per_minute": 600}, "VOYAGE_API_KEY", 1_000),
        (
            {"kind": "openai", "model": "text-embedding-3-small", "requests_per_minute": 600},
            "OPENAI_API_KEY",
            2_048,
        ),
    ],
    ids=["cohere", "voyage", "openai"],
)
def test_an_online_route_is_timed_by_its_own_kinds_request_limits(
    monkeypatch: pytest.MonkeyPatch, section: dict[str, Any], env: str, texts_per_request: int
) -> None:
    """plan assumed OpenAI's 2,048 texts a request for every online kind: a Cohere route (96) was timed
    about 21x too short."""
    monkeypatch.setenv(env, "unused")
    embedder = registry.build("embedder", section)
    report = PlanReport(documents=960_000, unique_texts=960_000, tokens=1_000_000)
    candidates = [routing.Candidate(RouteConfig(name=routing.CONFIGURED), section, embedder)]
    (route,) = routing.price(report, RunConfig(), candidates, {})
    requests = -(-960_000 // texts_per_request)
    assert route.duration_seconds == pytest.approx(requests * 60 / (600 * routing.PACING_SHARE), rel=1e-3)
