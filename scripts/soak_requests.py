"""What the soak's clients send (scripts/soak.py): well-formed generation requests of mixed
shapes, and malformed ones, each with what a correct server must answer."""

import json

WORDS = (
    "the quick brown fox jumps over a lazy dog while the compiler checks every borrow and the "
    "scheduler batches decode tokens with prefill chunks so that long prompts never stall "
    "running streams of tokens from many users at once"
).split()


def prompt_text(rng):
    """Short (a few tokens) to a few hundred tokens (about 1.3 tokens per word here)."""
    n = rng.choice([rng.randint(2, 10), rng.randint(30, 80), rng.randint(150, 300)])
    return "Summarise in one sentence: " + " ".join(rng.choice(WORDS) for _ in range(n))


def generation(rng, stream):
    """(path, body, n): a chat or completion request; sometimes n > 1, sometimes with an
    unknown field (which the server ignores, as README says)."""
    n = rng.choice([1, 1, 1, 2, 3])
    body = {
        "model": "any",
        "max_tokens": rng.randint(4, 24),
        "temperature": rng.choice([0, 0.7, 1.0]),
        "seed": rng.randint(0, 1 << 30),
        "n": n,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    if rng.random() < 0.1:
        body["x_soak_unknown_field"] = {"ignored": [1, 2, 3]}
    if rng.random() < 0.5:
        path = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": prompt_text(rng)}]
        if rng.random() < 0.3:
            body["messages"].insert(0, {"role": "system", "content": "Answer briefly."})
    else:
        path = "/v1/completions"
        body["prompt"] = prompt_text(rng)
    return path, body, n


def _chat(**extra):
    body = {"model": "any", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    body.update(extra)
    return body


def _nested(depth):
    return ('{"model": "any", "messages": ' + "[" * depth + "]" * depth + "}").encode()


# (name, method, path, body, content type, allowed statuses). Every answer must also be a JSON
# `{"error": {"message": ...}}`; none may be a 5xx. The statuses are those README.md promises.
MALFORMED = [
    ("bad_json", "POST", "/v1/chat/completions", b'{"model": "any", "messages": [', None, {400}),
    ("not_json", "POST", "/v1/completions", b"prompt=hello&max_tokens=3", None, {400}),
    ("empty_body", "POST", "/v1/completions", b"", None, {400}),
    ("json_array", "POST", "/v1/chat/completions", b"[1, 2, 3]", None, {400}),
    ("not_utf8", "POST", "/v1/completions", b'{"prompt": "\xff\xfe\xfd", "max_tokens": 3}', None, {400}),
    ("lone_surrogate", "POST", "/v1/completions", b'{"prompt": "a\\ud800b", "max_tokens": 3}', None, {400}),
    ("messages_string", "POST", "/v1/chat/completions", {"model": "any", "messages": "hello"}, None, {400}),
    ("max_tokens_string", "POST", "/v1/chat/completions", _chat(max_tokens="ten"), None, {400}),
    ("temperature_string", "POST", "/v1/chat/completions", _chat(temperature="hot"), None, {400}),
    ("n_fraction", "POST", "/v1/chat/completions", _chat(n=1.5), None, {400}),
    ("stream_string", "POST", "/v1/chat/completions", _chat(stream="yes"), None, {400}),
    ("prompt_number", "POST", "/v1/completions", {"prompt": 42, "max_tokens": 3}, None, {400}),
    ("stop_number", "POST", "/v1/chat/completions", _chat(stop=7), None, {400}),
    ("n_huge", "POST", "/v1/chat/completions", _chat(n=1000000), None, {400}),
    ("n_zero", "POST", "/v1/chat/completions", _chat(n=0), None, {400}),
    ("max_tokens_negative", "POST", "/v1/chat/completions", _chat(max_tokens=-1), None, {400}),
    ("max_tokens_huge", "POST", "/v1/chat/completions", _chat(max_tokens=10**30), None, {400}),
    ("number_overflow", "POST", "/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "temperature": 1e999}', None, {400}),
    ("temperature_negative", "POST", "/v1/chat/completions", _chat(temperature=-1), None, {400}),
    ("top_p_above_one", "POST", "/v1/chat/completions", _chat(top_p=2), None, {400}),
    ("logit_bias_bad_id", "POST", "/v1/chat/completions", _chat(logit_bias={"999999999": 1}), None, {400}),
    ("logprobs_huge", "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 3, "logprobs": 100000}, None, {400}),
    ("token_out_of_vocab", "POST", "/v1/completions", {"prompt": [999999999], "max_tokens": 3}, None, {400}),
    ("empty_messages", "POST", "/v1/chat/completions", {"model": "any", "messages": []}, None, {400}),
    ("unknown_role", "POST", "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "hi"}]}, None, {400}),
    ("prompt_too_long", "POST", "/v1/completions", {"prompt": "word " * 6000, "max_tokens": 4}, None, {400}),
    ("deep_nesting", "POST", "/v1/chat/completions", _nested(100000), None, {400}),
    ("unsupported_tfs_z", "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 3, "tfs_z": 0.5}, None, {400}),
    ("best_of_huge", "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 3, "best_of": 100000}, None, {400}),
    ("oversized_body", "POST", "/v1/completions", b'{"prompt": "' + b"a" * (3 << 20) + b'"}', None, {413}),
    ("unknown_route", "POST", "/v1/nothing", _chat(), None, {404}),
    ("wrong_method", "GET", "/v1/chat/completions", None, None, {405}),
    ("tokenize_wrong_type", "POST", "/tokenize", {"content": 5}, None, {400}),
    ("detokenize_bad_id", "POST", "/detokenize", {"tokens": [-1, 999999999]}, None, {400}),
]


def malformed_ok(status, allowed, body):
    """None when the answer is what a correct server gives, else what is wrong with it."""
    if status not in allowed:
        return f"status {status}, expected {sorted(allowed)}"
    try:
        err = json.loads(body)["error"]
        if not isinstance(err.get("message"), str) or not err["message"]:
            return "the error has no message"
    except (ValueError, KeyError, TypeError):
        return f"not a JSON error: {body[:80]!r}"
    return None
