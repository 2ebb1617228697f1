"""nucleus serve, driven by the official `openai` client (real model, see scripts/e2e.sh)."""

import json
import urllib.request

import openai
import pytest

MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
    {"role": "user", "content": "Name three colours of the rainbow."},
]


def test_models_lists_the_served_model(client, model_id):
    ids = [m.id for m in client.models.list().data]
    assert model_id in ids


def test_completion(client, model_id):
    r = client.completions.create(
        model=model_id, prompt="def add(a, b):\n", max_tokens=24, temperature=0
    )
    assert r.object == "text_completion"
    c = r.choices[0]
    assert c.text.strip(), r
    assert c.finish_reason in ("length", "stop")
    assert r.usage.prompt_tokens > 0
    assert 0 < r.usage.completion_tokens <= 24
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert "return" in c.text or "a + b" in c.text, c.text


def test_chat_completion(client, model_id):
    r = client.chat.completions.create(
        model=model_id,
        messages=[{"role": "user", "content": "What is 2 + 2? Reply with just the number."}],
        max_tokens=16,
        temperature=0,
    )
    assert r.object == "chat.completion"
    m = r.choices[0].message
    assert m.role == "assistant"
    assert "4" in m.content, m.content
    assert r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens > 0


def test_streamed_chat_reassembles_to_the_same_text_with_the_same_seed(client, model_id):
    args = dict(model=model_id, messages=MESSAGES, max_tokens=48, temperature=0.9, seed=1234)
    whole = client.chat.completions.create(**args)
    text = whole.choices[0].message.content
    stream = client.chat.completions.create(
        **args, stream=True, stream_options={"include_usage": True}
    )
    pieces, finish, usage, roles = [], None, None, []
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            if ch.delta.role:
                roles.append(ch.delta.role)
            if ch.delta.content:
                pieces.append(ch.delta.content)
            if ch.finish_reason:
                finish = ch.finish_reason
    assert roles == ["assistant"]
    assert "".join(pieces) == text
    assert len(pieces) > 1
    assert finish == whole.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens


def test_logprobs(client, model_id):
    r = client.chat.completions.create(
        model=model_id, messages=MESSAGES, max_tokens=8, temperature=0,
        logprobs=True, top_logprobs=3,
    )
    content = r.choices[0].logprobs.content
    assert len(content) >= 1
    for t in content:
        assert t.logprob <= 0.0
        assert len(t.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert t.logprob == pytest.approx(t.top_logprobs[0].logprob, abs=1e-5)
    assert "".join(t.token for t in content) == r.choices[0].message.content

    c = client.completions.create(
        model=model_id, prompt="The capital of France is", max_tokens=4, temperature=0, logprobs=2
    )
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert all(x <= 0.0 for x in lp.token_logprobs)


def test_stop_string_is_honoured(client, model_id):
    args = dict(
        model=model_id,
        messages=[{"role": "user", "content": "Count from 1 to 10, separated by commas."}],
        max_tokens=40,
        temperature=0,
    )
    full = client.chat.completions.create(**args).choices[0].message.content
    assert "5" in full, full
    r = client.chat.completions.create(**args, stop=["5"])
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"
    assert "5" not in text
    assert full.startswith(text)
    # Streamed: the stop string never shows up in a chunk either.
    streamed = "".join(
        ch.choices[0].delta.content or ""
        for ch in client.chat.completions.create(**args, stop="5", stream=True)
        if ch.choices
    )
    assert streamed == text


def test_n_choices_are_independent(client, model_id):
    r = client.chat.completions.create(
        model=model_id, messages=MESSAGES, max_tokens=16, temperature=1.0, seed=7, n=3
    )
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert len({c.message.content for c in r.choices}) >= 2


def test_errors(client, model_id):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_id, messages=MESSAGES, temperature=-1)
    assert e.value.body["param"] == "temperature"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_id, messages=MESSAGES, n=17)
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=model_id, prompt="hi", max_tokens=10**7)
    assert e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model_id, prompt="")


def test_health_and_metrics(base_url):
    with urllib.request.urlopen(base_url + "/health", timeout=5) as r:
        assert json.load(r)["status"] == "ok"
    with urllib.request.urlopen(base_url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    for name in (
        "nucleus_requests_running",
        "nucleus_kv_blocks_free",
        "nucleus_generation_tokens_total",
        "nucleus_time_to_first_token_seconds_bucket",
        "nucleus_inter_token_latency_seconds_count",
    ):
        assert name in text


def test_prefix_cache_reports_cached_tokens_through_the_client(client, model_id):
    system = "You are a meticulous reviewer of Python code. " * 12
    ask = lambda q: client.chat.completions.create(  # noqa: E731
        model=model_id,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": q}],
        max_tokens=8,
        temperature=0,
    )
    first = ask("Is `x = 1` valid Python?")
    second = ask("Is `def f(): pass` valid Python?")
    cached = second.usage.prompt_tokens_details.cached_tokens
    # The shared system prompt is served from the cache, in whole blocks of 16 tokens.
    assert cached >= first.usage.prompt_tokens // 2, second.usage
    assert cached % 16 == 0 and cached < second.usage.prompt_tokens


def test_context_policy_truncate_is_an_extension_field(client, model_id):
    long_prompt = "word " * 5000  # longer than the server's window
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=model_id, prompt=long_prompt, max_tokens=4)
    r = client.completions.create(
        model=model_id,
        prompt=long_prompt,
        max_tokens=4,
        temperature=0,
        extra_body={"context_policy": "truncate"},
    )
    assert r.usage.completion_tokens == 4
    assert r.model_extra["dropped_tokens"] > 0


def test_fields_the_client_sends(client, model_id):
    args = dict(model=model_id, messages=MESSAGES, temperature=0)
    r = client.chat.completions.create(
        **args, max_completion_tokens=5, user="u-1", metadata={"run": "e2e"}
    )
    assert r.usage.completion_tokens <= 5
    # Legacy completions: best_of samples more and returns the most likely.
    r = client.completions.create(
        model=model_id, prompt="def add(a, b):\n", max_tokens=8, temperature=1.0, seed=3,
        n=1, best_of=3,
    )
    assert len(r.choices) == 1 and r.usage.completion_tokens <= 24
    # The legacy `functions` are refused, naming the field (`tools` work: test_structured.py).
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**args, functions=[{"name": "f", "parameters": {}}])
    assert e.value.body["param"] == "functions"
    assert e.value.body["code"] == "unsupported_parameter"


def test_beam_search_and_explain_are_extension_fields(client, model_id):
    r = client.chat.completions.create(
        model=model_id, messages=MESSAGES, max_tokens=8, n=2,
        extra_body={"use_beam_search": True, "best_of": 3, "ignore_eos": True},
    )
    texts = [c.message.content for c in r.choices]
    assert len(texts) == 2 and texts[0] != texts[1], texts
    r = client.chat.completions.create(
        model=model_id, messages=MESSAGES, max_tokens=4, temperature=0.7, seed=5,
        extra_body={"explain": True, "ignore_eos": True},
    )
    steps = r.choices[0].model_extra["explain"]
    assert len(steps) == 4
    assert steps[0]["stages"][0]["stage"] == "input" and 0 < steps[0]["chosen_prob"] <= 1
