"""Hosted opponents: any OpenAI-compatible chat endpoint as a fixed opponent.

An actor name ``hosted:MODEL@BASE_URL`` (optionally ``?key=ENV_VAR&timeout=S&...``: the options
are :class:`HostedSettings`' settings, each value read as YAML like any ``--set``) seats the
model ``MODEL`` served at ``BASE_URL`` (the URL that ends in ``/v1``). Each turn the seat's
observation, rendered by the seat's prompt template, goes to ``POST BASE_URL/chat/completions``
as one user message; the reply's text goes through the seat's action extractor like any model
completion.

- The API key is read from the environment variable named by ``key`` (default: none, for local
  servers) when the request is made; it is never stored in configs, logs or shards (the actor
  name holds only the variable's name).
- Requests run in a thread pool of ``concurrency`` so the local engine keeps working while
  hosted seats think. Each request has a ``timeout`` and ``retries`` with exponential backoff on
  connection errors, timeouts, 429 and 5xx replies.
- When every attempt fails: ``on_failure=error`` stops the rollout with a clear error naming the
  endpoint and what was tried; ``on_failure=skip`` records the game as errored (with the
  reason) and the rollout goes on.

No request is made unless a hosted actor is configured.
"""

from __future__ import annotations

import os
import time
import urllib.parse
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Literal

from pydantic import Field

from ub.errors import UbError
from ub.numbers import NumberError, url_port
from ub.settings import Section, setting_value

PREFIX = "hosted:"
MAX_TIMEOUT_S = 86_400.0
"""The longest ``timeout`` (a day): the socket under the HTTP client refuses one that does not fit
its C type, mid-game."""


class HostedSettings(Section):
    """A hosted actor: the model and its endpoint (``hosted:MODEL@BASE_URL``), and the options
    its name may give (``?key=ENV_VAR&timeout=60``), each named here as in the name."""

    model: str = Field(min_length=1, description="The model's name at the endpoint (MODEL).")
    base_url: str = Field(min_length=1, description="The endpoint (BASE_URL, ending in /v1).")
    key_env: str | None = Field(None, alias="key", description="The environment variable "
                                "holding the API key, read at each request and never stored; "
                                "null: no key (a local server).")
    timeout: float = Field(30.0, gt=0, le=MAX_TIMEOUT_S, description="Seconds one request may "
                           "take.")
    retries: int = Field(2, ge=0, description="Attempts after the first, with exponential "
                         "backoff, on connection errors, timeouts, 429 and 5xx replies.")
    concurrency: int = Field(8, ge=1, description="Requests in flight at once (a thread pool, "
                             "while the local engine keeps generating).")
    on_failure: Literal["error", "skip"] = Field("error", description="When every attempt "
                                                 "fails: error stops the rollout; skip records "
                                                 "the game as errored and goes on.")
    max_tokens: int = Field(256, ge=1, description="Most tokens of a reply.")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature of the replies.")


OPTIONS = tuple(info.alias or name for name, info in HostedSettings.model_fields.items()
                if name not in ("model", "base_url"))
"""The options a hosted actor's name may give, as it names them."""


def parse_hosted(name: str) -> HostedSettings:
    """Parse ``hosted:MODEL@BASE_URL[?options]`` with one clear error per problem."""
    body = name[len(PREFIX):]
    model, at, rest = body.partition("@")
    if not at or not model or not rest:
        raise UbError(f"hosted actor {name!r} must look like hosted:MODEL@BASE_URL, e.g. "
                      "hosted:Qwen3-8B@http://127.0.0.1:8000/v1")
    url, _, query = rest.partition("?")
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise UbError(f"hosted actor {name!r}: {url!r} is not an http(s) URL")
    try:
        url_port(url)
    except NumberError as exc:
        raise UbError(f"hosted actor {name!r}: {url!r}: {exc}") from None
    options = {option: setting_value(text) for option, text
               in urllib.parse.parse_qsl(query, keep_blank_values=True)}
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise UbError(f"hosted actor {name!r}: unknown option(s) {', '.join(unknown)}; valid: "
                      f"{', '.join(sorted(OPTIONS))}")
    try:
        return HostedSettings.from_dict({"model": model, "base_url": url.rstrip("/"), **options})
    except UbError as exc:
        raise UbError(f"hosted actor {name!r}: option {exc}") from None


class HostedFailure(UbError):
    """Every attempt at a hosted opponent's move failed."""


class HostedClient:
    """Chat completions against one endpoint, with a bounded thread pool."""

    def __init__(self, settings: HostedSettings) -> None:
        import httpx

        self.settings = settings
        self._http = httpx.Client(timeout=settings.timeout)
        self._pool = ThreadPoolExecutor(settings.concurrency, thread_name_prefix="ub-hosted")

    def api_key(self) -> str | None:
        name = self.settings.key_env
        if name is None:
            return None
        value = os.environ.get(name)
        if not value:
            raise UbError(f"hosted opponent {self.settings.model} at {self.settings.base_url} "
                          f"needs an API key in the environment variable {name}, which is not "
                          "set")
        return value

    def submit(self, prompt: str) -> Future:
        """Ask for a move; the future's result is the reply text (or a HostedFailure)."""
        return self._pool.submit(self.complete, prompt)

    def complete(self, prompt: str) -> str:
        import httpx

        s = self.settings
        headers = {"Content-Type": "application/json"}
        key = self.api_key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        body = {"model": s.model, "messages": [{"role": "user", "content": prompt}],
                "max_tokens": s.max_tokens, "temperature": s.temperature}
        url = f"{s.base_url}/chat/completions"
        problems = []
        for attempt in range(s.retries + 1):
            if attempt:
                time.sleep(min(0.5 * 2 ** (attempt - 1), 8.0))
            try:
                reply = self._http.post(url, json=body, headers=headers)
            except httpx.TimeoutException:
                problems.append(f"timed out after {s.timeout:g} s")
                continue
            except httpx.HTTPError as exc:
                problems.append(f"{type(exc).__name__}: {exc}")
                continue
            if reply.status_code == 429 or reply.status_code >= 500:
                problems.append(f"HTTP {reply.status_code}")
                continue
            if reply.status_code != 200:
                # 4xx other than 429: the request itself is wrong; retrying cannot help.
                problems.append(f"HTTP {reply.status_code}: {reply.text[:200]}")
                break
            try:
                return reply.json()["choices"][0]["message"]["content"] or ""
            except (ValueError, KeyError, IndexError, TypeError):
                problems.append(f"malformed reply: {reply.text[:120]!r}")
                continue
        raise HostedFailure(f"hosted opponent {s.model} at {url} failed after "
                            f"{len(problems)} attempt(s): {'; '.join(problems)}")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._http.close()


def check_hosted(name: str) -> None:
    """Before any game: the key variable is set and the endpoint answers ``GET /models``."""
    import httpx

    settings = parse_hosted(name)
    if settings.key_env is not None and not os.environ.get(settings.key_env):
        raise UbError(f"hosted opponent {settings.model} at {settings.base_url} needs an API "
                      f"key in the environment variable {settings.key_env}, which is not set")
    url = f"{settings.base_url}/models"
    try:
        httpx.get(url, timeout=min(settings.timeout, 10.0))
    except httpx.HTTPError as exc:
        raise UbError(f"hosted opponent endpoint {url} is unreachable ({type(exc).__name__}: "
                      f"{exc}); start the server or fix the URL") from None
