"""The LLM proposer: any OpenAI-compatible chat endpoint (OpenAI, DeepSeek, vLLM, SGLang, Ollama).

    $ export OPENAI_API_KEY=sk-...  HTAM_MODEL=deepseek-reasoner  OPENAI_BASE_URL=https://api.deepseek.com/v1
    $ export OPENAI_BASE_URL=http://localhost:8000/v1  HTAM_MODEL=Qwen/Qwen2.5-Coder-32B-Instruct   # local

    >>> prop = LLMProposer(LLMConfig.from_env()).propose(request)
    >>> [c.tags for c in prop.candidates], prop.note, prop.usage["cost_usd"]

One request's n candidates are n separate completions run concurrently (bounded by a semaphore
shared by every thread using the proposer), not n choices in one reply: every endpoint supports it,
and one failed or truncated reply costs one candidate. The openai client's own retries are off;
ours back off with jitter, honour Retry-After, and end in EndpointError, which propose() turns into
an empty Proposal whose note starts with "endpoint_error:". The API key never leaves the client:
it is masked in repr, left out of to_json, and scrubbed from every error text we produce.
"""
from __future__ import annotations

import email.utils
import functools
import logging
import os
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from urllib.parse import urlparse

from torch_htam.proposers.base import Candidate, Proposal, ProposalRequest
from torch_htam.proposers.prompts import render_messages, strategy_id
from torch_htam.proposers.reply import parse_reply

log = logging.getLogger(__name__)

LOCAL_HOSTS = ("localhost", "::1", "0.0.0.0")

@functools.lru_cache(maxsize=1)
def _prior_ids() -> frozenset[str]:
    """Every strategy id of the shipped prior (data, read once)."""
    return frozenset(_prior_applies_to())


@functools.lru_cache(maxsize=1)
def _prior_applies_to() -> dict[str, tuple[str, ...]]:
    """Strategy id -> the task kinds its prior entry applies to (empty: every kind)."""
    from torch_htam.htg import HTG
    return {s.id: tuple(s.applies_to) for s in HTG.from_prior().strategies.values()}


RETRY_STATUS = (408, 409, 429)     # plus every 5xx; other 4xx (bad key, unknown model) are final
PERMANENT_STATUS = (401, 403, 404)  # the configuration is wrong: retrying later won't help


@dataclass
class LLMConfig:
    """Endpoint, model, limits and prices. Prices are USD per 1M tokens; None = unknown (cost 0).

    >>> LLMConfig.from_env(timeout_s=60).check()   # None when usable, else what to set
    """
    model: str = ""
    base_url: str | None = None    # None = the openai package default (api.openai.com)
    api_key: str = ""
    timeout_s: float = 120.0       # per request; reasoning models can think for minutes
    max_retries: int = 4           # retries after the first try
    backoff_s: float = 1.0         # first backoff; doubles per retry, with jitter
    backoff_max_s: float = 30.0    # cap on one wait, Retry-After included
    concurrency: int = 4           # in-flight requests across all threads
    temperature: float | None = 0.7   # None: the server's default (some models accept no other)
    max_tokens: int | None = 16384    # room for reasoning plus a full kernel; None: no cap
    price_in_per_m: float | None = None
    price_out_per_m: float | None = None

    @staticmethod
    def from_env(**overrides) -> "LLMConfig":
        """Read HTAM_MODEL, OPENAI_BASE_URL, OPENAI_API_KEY, HTAM_PRICE_IN / HTAM_PRICE_OUT (USD/1M)."""
        env = os.environ
        price = lambda k: float(env[k]) if env.get(k) else None  # noqa: E731
        cfg = dict(model=env.get("HTAM_MODEL", ""), base_url=env.get("OPENAI_BASE_URL") or None,
                   api_key=env.get("OPENAI_API_KEY", ""),
                   price_in_per_m=price("HTAM_PRICE_IN"), price_out_per_m=price("HTAM_PRICE_OUT"))
        cfg.update(overrides)
        return LLMConfig(**cfg)

    @property
    def local(self) -> bool:
        """A server on this machine (vLLM, SGLang, Ollama) needs no real key."""
        host = urlparse(self.base_url or "").hostname or ""
        return host in LOCAL_HOSTS or host.startswith("127.")

    def key(self) -> str:
        return self.api_key or ("local" if self.local else "")

    def check(self) -> str | None:
        """None if usable; otherwise which environment variables to set."""
        missing = []
        if not self.key():
            missing.append("OPENAI_API_KEY (with OPENAI_BASE_URL for a hosted non-OpenAI endpoint), "
                           "or OPENAI_BASE_URL=http://localhost:8000/v1 for a local server")
        if not self.model:
            missing.append("HTAM_MODEL (e.g. gpt-4.1, deepseek-reasoner, or the model your local "
                           "server serves)")
        return "LLM endpoint not configured: set " + ", and ".join(missing) if missing else None

    def to_json(self) -> dict:
        """Everything but the key (safe to record with a run)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "api_key"}

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.to_json().items())
        return f"LLMConfig({shown}, api_key={'***' if self.api_key else ''!r})"


class EndpointError(RuntimeError):
    """The endpoint failed after all retries (or at once, for a final 4xx).
    permanent: the configuration is wrong (bad key, unknown model), so later calls will fail too."""

    def __init__(self, message: str, status: int | None = None, permanent: bool = False):
        super().__init__(message)
        self.status = status
        self.permanent = permanent


@dataclass
class Usage:
    """Tokens and cost. estimated: some counts were len/4 guesses (the server sent no usage);
    cost_known: prices were configured."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    requests: int = 0
    estimated: bool = False
    cost_known: bool = True

    def add(self, other: "Usage") -> None:
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.cost_usd += other.cost_usd
        self.requests += other.requests
        self.estimated |= other.estimated
        self.cost_known &= other.cost_known

    def to_dict(self) -> dict[str, float]:
        """The Proposal.usage shape: floats only; flags as 0.0/1.0."""
        return {"prompt_tokens": float(self.prompt_tokens),
                "completion_tokens": float(self.completion_tokens),
                "cost_usd": self.cost_usd, "requests": float(self.requests),
                "estimated": float(self.estimated), "cost_known": float(self.cost_known)}


@dataclass
class Completion:
    text: str
    usage: Usage
    finish_reason: str = ""


class LLMClient:
    """Chat completions with our retry loop; thread-safe; one semaphore bounds in-flight requests.

    >>> LLMClient(cfg).complete([{"role": "user", "content": "hi"}]).text
    """

    def __init__(self, config: LLMConfig):
        problem = config.check()
        if problem:
            raise ValueError(problem)
        import openai  # NOTE: lazy, so `import torch_htam` works where openai is not installed
        self.config = config
        self._openai = openai
        self._client = openai.OpenAI(base_url=config.base_url, api_key=config.key(),
                                     timeout=config.timeout_s, max_retries=0)
        self._slots = threading.BoundedSemaphore(max(1, config.concurrency))
        sampling = {"temperature": config.temperature, "max_tokens": config.max_tokens}
        self._params = {k: v for k, v in sampling.items() if v is not None}   # None: server default
        self._params_lock = threading.Lock()

    def complete(self, messages: list[dict[str, str]]) -> Completion:
        """One completion, retried on 408/409/429/5xx, timeouts and connection errors."""
        cfg, tries, attempt = self.config, self.config.max_retries + 1, 0
        while True:
            t0 = time.monotonic()
            with self._params_lock:
                params = dict(self._params)
            try:
                with self._slots:   # NOTE: held only while the request is in flight, not in backoff
                    resp = self._client.chat.completions.create(
                        model=cfg.model, messages=messages, **params)
            except self._openai.APIStatusError as e:
                status, message = e.status_code, self._scrub(_message(e))
                if status == 400 and self._adapt(message, params):
                    continue   # a parameter this model rejects was changed: not a failure
                retry = status in RETRY_STATUS or status >= 500
                what, wait = f"HTTP {status}: {message}", _retry_after(e.response)
            except self._openai.APIConnectionError as e:   # APITimeoutError is a subclass
                retry, status, wait = True, None, None
                what = ("timeout after %.1f s" % cfg.timeout_s if isinstance(e, self._openai.APITimeoutError)
                        else f"connection error: {self._scrub(str(e.__cause__ or e))}")
            except self._openai.APIError as e:   # e.g. a reply that is not the expected JSON
                retry, status, wait = True, None, None
                what = f"bad response: {self._scrub(str(e))[:300]}"
            else:
                return self._completion(resp, messages)
            attempt += 1
            if not retry:
                raise EndpointError(f"{what} (not retried)", status, permanent=status in PERMANENT_STATUS)
            if attempt == tries:
                raise EndpointError(f"{what}; gave up after {tries} tries", status)
            delay = self._backoff(attempt - 1, wait)
            log.warning("LLM request failed (%s, %.1f s); retry %d/%d in %.2f s",
                        what, time.monotonic() - t0, attempt, cfg.max_retries, delay)
            time.sleep(delay)

    def _adapt(self, message: str, sent: dict) -> bool:
        """Follow a 400 that names a parameter this model rejects; True if the next try differs.

        OpenAI reasoning models (o-series, gpt-5) want max_completion_tokens instead of max_tokens
        and accept only the default temperature; other servers take both as sent.
        """
        rename = "max_completion_tokens" in message and "max_tokens" in sent
        drop = not rename and "temperature" in message and "temperature" in sent
        if not (rename or drop):
            return False
        with self._params_lock:
            p = self._params
            if sent.keys() == p.keys():   # else another thread adapted already
                if rename:
                    p["max_completion_tokens"] = p.pop("max_tokens")
                else:
                    del p["temperature"]
                log.warning("LLM endpoint rejected a parameter (%s); now sending %s", message, sorted(p))
        return True

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        cfg = self.config
        if retry_after is not None:
            return min(retry_after, cfg.backoff_max_s)
        # Jitter in [1/2, 1] of the exponential step: spreads retries of concurrent requests apart.
        return min(cfg.backoff_max_s, cfg.backoff_s * 2 ** attempt) * random.uniform(0.5, 1.0)

    def _completion(self, resp, messages) -> Completion:
        choice = resp.choices[0] if resp.choices else None
        text = (choice.message.content or "") if choice else ""
        u, cfg = resp.usage, self.config
        if u is not None and u.prompt_tokens is not None:
            usage = Usage(u.prompt_tokens, u.completion_tokens or 0)
        else:   # NOTE: ~4 characters per token for English and code
            chars = sum(len(m["content"]) for m in messages)
            usage = Usage(chars // 4, len(text) // 4, estimated=True)
        usage.requests = 1
        usage.cost_known = cfg.price_in_per_m is not None and cfg.price_out_per_m is not None
        if usage.cost_known:
            usage.cost_usd = (usage.prompt_tokens * cfg.price_in_per_m
                              + usage.completion_tokens * cfg.price_out_per_m) / 1e6
        log.info("LLM reply: %d prompt + %d completion tokens%s, finish=%s", usage.prompt_tokens,
                 usage.completion_tokens, " (estimated)" if usage.estimated else "",
                 choice.finish_reason if choice else None)
        return Completion(text, usage, (choice.finish_reason or "") if choice else "")

    def _scrub(self, text: str) -> str:
        key = self.config.api_key
        return text.replace(key, "***") if key else text


class LLMProposer:
    """Proposer backed by an OpenAI-compatible endpoint; `usage` holds the run's totals.

    >>> p = LLMProposer(LLMConfig.from_env())
    >>> p.propose(ProposalRequest(task=t, direction="memory_access", strategies=strats, n=4))
    """
    name = "llm"

    def __init__(self, config: LLMConfig, client: LLMClient | None = None):
        self.config = config
        self.client = client or LLMClient(config)
        self.usage = Usage()
        self._lock = threading.Lock()

    def supports(self, task) -> set[str]:
        """Every prior strategy whose applies_to fits the task's kind: the model can write any."""
        from torch_htam.htg import KINDS
        return {sid for sid, kinds in _prior_applies_to().items()
                if not kinds or task.kind not in KINDS or task.kind in kinds}

    def propose(self, request: ProposalRequest) -> Proposal:
        """n candidates (or fewer; note says why). Never raises for endpoint trouble."""
        try:
            return self.propose_or_raise(request)
        except EndpointError as e:
            return Proposal([], note=f"endpoint_error: {e}", usage=Usage().to_dict())

    def propose_or_raise(self, request: ProposalRequest) -> Proposal:
        """Like propose, but raises EndpointError when every completion failed at the endpoint."""
        messages = render_messages(request)
        n = max(1, request.n)
        with ThreadPoolExecutor(max_workers=min(n, max(1, self.config.concurrency))) as pool:
            results = list(pool.map(lambda _: self._try_complete(messages), range(n)))
        errors = [r for r in results if isinstance(r, EndpointError)]
        if len(errors) == n:
            raise errors[0]
        # The model may name any strategy of the prior, not only the retrieved ones; made-up ids
        # are dropped, so only real strategies reach the HTG.
        known = {strategy_id(s) for s in request.strategies} | _prior_ids()
        usage, candidates, notes, seen = Usage(), [], [], set()
        for i, r in enumerate(results):
            if isinstance(r, EndpointError):
                notes.append(f"reply {i}: endpoint_error: {r}")
                continue
            usage.add(r.usage)
            reply = parse_reply(r.text, known)
            if reply.source is None:
                cut = " (finish_reason=length)" if r.finish_reason == "length" else ""
                notes.append(f"reply {i}: {reply.reason}{cut}")
            elif reply.source in seen:
                notes.append(f"reply {i}: duplicate")
            else:
                seen.add(reply.source)
                candidates.append(Candidate(reply.source, reply.tags, origin=self.name))
            if reply.dropped:
                notes.append(f"reply {i}: unknown strategy ids dropped: {', '.join(reply.dropped)}")
        with self._lock:
            self.usage.add(usage)
        head = f"llm {self.config.model}: {len(candidates)} candidate(s) from {n} completion(s)"
        return Proposal(candidates, note="; ".join([head] + notes), usage=usage.to_dict())

    def _try_complete(self, messages) -> Completion | EndpointError:
        try:
            return self.client.complete(messages)
        except EndpointError as e:
            return e


def _retry_after(response) -> float | None:
    """Seconds from retry-after-ms / Retry-After (seconds or an HTTP date), None if absent."""
    headers = getattr(response, "headers", None) or {}
    try:
        if headers.get("retry-after-ms"):
            return max(0.0, float(headers["retry-after-ms"]) / 1000)
        value = headers.get("retry-after")
        if not value:
            return None
        try:
            return max(0.0, float(value))
        except ValueError:
            when = email.utils.parsedate_to_datetime(value)
            return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def _message(e) -> str:
    """The server's error message (the client pulls it out of the JSON body), short."""
    return str(getattr(e, "message", e))[:300]
