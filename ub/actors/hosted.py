"""Hosted opponents: any OpenAI-compatible chat endpoint as a fixed opponent.

An actor name ``hosted:MODEL@BASE_URL`` (optionally ``?key=ENV_VAR&timeout=S&...``: the options
are :class:`HostedSettings`' settings, each value read as YAML like any ``--set``) seats the
model ``MODEL`` served at ``BASE_URL`` (the URL that ends in ``/v1``). Each turn the seat's
observation, rendered by the seat's prompt template, goes to ``POST BASE_URL/chat/completions``
as one user message; the reply's text goes through the seat's action extractor like any model
completion.

- The API key is read from the environment variable named by ``key`` (default: none, for local
  servers) when the request is made; it is never stored in configs, logs or shards (the actor
  name holds only the variable's name). So ``key`` must be a variable's name
  (``[A-Za-z_][A-Za-z0-9_]*``), a URL with a user name or password is refused, no message
  shows either (:func:`shown`), and an error that a server's reply would carry the key into
  has it masked. A key sent over plain ``http`` to a host other than this machine is warned
  about before any game.
- Requests run in a thread pool of ``concurrency`` so the local engine keeps working while
  hosted seats think. Each request has a ``timeout`` and ``retries`` with exponential backoff on
  connection errors, timeouts, 429 and 5xx replies.
- When every attempt fails: ``on_failure=error`` stops the rollout with a clear error naming the
  endpoint and what was tried; ``on_failure=skip`` records the game as errored (with the
  reason) and the rollout goes on.

No request is made unless a hosted actor is configured.
"""

from __future__ import annotations

import ipaddress
import os
import re
import sys
import time
import urllib.parse
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any, Literal

from pydantic import Field, field_validator

from ub.actors.base import Actor, Batch, Move, MoveFailed, Pending, Turn
from ub.errors import UbError
from ub.games.actions import get_extractor
from ub.games.templates import get_template
from ub.numbers import NumberError, url_port
from ub.settings import Section, setting_value

PREFIX = "hosted:"
MAX_TIMEOUT_S = 86_400.0
"""The longest ``timeout`` (a day): the socket under the HTTP client refuses one that does not fit
its C type, mid-game."""
MAX_RETRIES = 10
"""The most ``retries`` (with the backoff capped at 8 s: about a minute and a half a move)."""
MAX_CONCURRENCY = 256
"""The most requests in flight (each a thread)."""
MAX_TOKENS = 65_536
"""The longest reply asked for."""
KEY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""What ``key=`` takes: an environment variable's name, never the key."""
TOKEN_SHAPED = re.compile(  # GitHub, Hugging Face, Stripe, Google, AWS; any long mix
    r"(gh[opusr]_[A-Za-z0-9]{30,}|github_pat_\w{30,}|hf_[A-Za-z0-9]{30,}"
    r"|[sr]k_(live|test)_[A-Za-z0-9]{20,}|AIza\w{30,}|(AKIA|ASIA)[0-9A-Z]{16}"
    r"|(?=.*[a-z])(?=.*[A-Z])(?=.*[0-9]).{20,})$")
"""A key that would also pass for a variable's name (``ghp_...``, ``hf_...``): taken for the
key, so never stored nor repeated."""
MASK = "***"


class HostedSettings(Section):
    """A hosted actor: the model and its endpoint (``hosted:MODEL@BASE_URL``), and the options
    its name may give (``?key=ENV_VAR&timeout=60``), each named here as in the name."""

    model: str = Field(min_length=1, description="The model's name at the endpoint (MODEL).")
    base_url: str = Field(min_length=1, description="The endpoint (BASE_URL, ending in /v1).")
    key_env: str | None = Field(None, alias="key", description="The name of the environment "
                                "variable holding the API key (letters, digits and _; never the "
                                "key itself), read at each request and never stored; null: no "
                                "key (a local server).")
    timeout: float = Field(30.0, gt=0, le=MAX_TIMEOUT_S, description="Seconds one request may "
                           "take.")
    retries: int = Field(2, ge=0, le=MAX_RETRIES, description="Attempts after the first, with "
                         "exponential backoff, on connection errors, timeouts, 429 and 5xx "
                         "replies.")
    concurrency: int = Field(8, ge=1, le=MAX_CONCURRENCY, description="Requests in flight at "
                             "once (a thread pool, while the local engine keeps generating).")
    on_failure: Literal["error", "skip"] = Field("error", description="When every attempt "
                                                 "fails: error stops the rollout; skip records "
                                                 "the game as errored and goes on.")
    max_tokens: int = Field(256, ge=1, le=MAX_TOKENS, description="Most tokens of a reply.")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature of the replies.")

    @field_validator("key_env")
    @classmethod
    def _a_variables_name(cls, value: str | None) -> str | None:
        if value is not None and not is_variable_name(value):
            raise ValueError(KEY_HELP)  # (the value itself is not repeated: it may be the key)
        return value


def is_variable_name(value: str) -> bool:
    """Whether ``key=``'s ``value`` names a variable: letters, digits and ``_``, and not shaped
    like a token (:data:`TOKEN_SHAPED`)."""
    return bool(KEY_NAME.fullmatch(value)) and not TOKEN_SHAPED.match(value)


KEY_HELP = ("key= takes the name of the environment variable that holds the API key (letters, "
            "digits and _, not starting with a digit, and not shaped like a token: ghp_..., "
            "hf_..., a long mix of cases and digits), never the key itself, which would be "
            "stored with the actor's name in the run's config, data, W&B and Prefect: export "
            "the key, e.g. as OPENAI_API_KEY, and write key=OPENAI_API_KEY")


OPTIONS = tuple(info.alias or name for name, info in HostedSettings.model_fields.items()
                if name not in ("model", "base_url"))
"""The options a hosted actor's name may give, as it names them."""


def shown(text: str) -> str:
    """A hosted actor's name (or its URL) as messages show it, with what may be a secret
    masked: a URL's user name and password, a ``key=`` that is no variable's name (a key
    given in its place) and the value of an option that is none of :data:`OPTIONS`
    (``api_key=...``, ``token=...``)."""
    text = re.sub(r"(://)[^/?#]*@", rf"\g<1>{MASK}@", text)

    def option(m: re.Match[str]) -> str:
        name, value = m.group(2), urllib.parse.unquote_plus(m.group(3))
        safe = (not value or is_variable_name(value)) if name == "key" else name in OPTIONS
        return f"{m.group(1)}{name}={m.group(3) if safe else MASK}"

    return re.sub(r"([?&])([^=&#]*)=([^&#]*)", option, text)


def parse_hosted(name: str) -> HostedSettings:
    """Parse ``hosted:MODEL@BASE_URL[?options]`` with one clear error per problem (which
    shows the name with any secret in it masked: :func:`shown`)."""
    body = name[len(PREFIX):]
    model, at, rest = body.partition("@")
    if not at or not model or not rest:
        raise UbError(f"hosted actor {shown(name)!r} must look like hosted:MODEL@BASE_URL, e.g. "
                      "hosted:Qwen3-8B@http://127.0.0.1:8000/v1")
    url, _, query = rest.partition("?")
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise UbError(f"hosted actor {shown(name)!r}: {shown(url)!r} is not an http(s) URL")
    if "@" in parsed.netloc:
        raise UbError(f"hosted actor {shown(name)!r}: a URL with a user name or password is "
                      "refused (it would be stored with the actor's name in the run's config, "
                      "data, W&B and Prefect): put the API key in an environment variable and "
                      "name it with ?key=VAR")
    try:
        url_port(url)
    except NumberError as exc:
        raise UbError(f"hosted actor {shown(name)!r}: {url!r}: {exc}") from None
    options = {option: setting_value(text) for option, text
               in urllib.parse.parse_qsl(query, keep_blank_values=True)}
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise UbError(f"hosted actor {shown(name)!r}: unknown option(s) {', '.join(unknown)}; "
                      f"valid: {', '.join(sorted(OPTIONS))}")
    key = options.get("key")
    if key is not None and not (isinstance(key, str) and is_variable_name(key)):
        raise UbError(f"hosted actor {shown(name)!r}: {KEY_HELP}")
    try:
        return HostedSettings.from_dict({"model": model, "base_url": url.rstrip("/"), **options})
    except UbError as exc:
        raise UbError(f"hosted actor {shown(name)!r}: option {exc}") from None


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
        said = "; ".join(problems)
        if key:  # (a server may echo the request's headers in its error)
            said = said.replace(key, MASK)
        raise HostedFailure(f"hosted opponent {s.model} at {url} failed after "
                            f"{len(problems)} attempt(s): {said}")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._http.close()


_WARNED: set[str] = set()


def is_loopback(url: str) -> bool:
    """Whether ``url``'s host is this machine (``localhost`` or a loopback address)."""
    host = urllib.parse.urlparse(url).hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_hosted(name: str) -> None:
    """Before any game: the key variable is set and the endpoint answers ``GET /models``. A
    plain ``http`` endpoint on another machine is warned about once per process (what the
    seat sends, its key included, crosses the network unencrypted)."""
    import httpx

    settings = parse_hosted(name)
    if settings.key_env is not None and not os.environ.get(settings.key_env):
        raise UbError(f"hosted opponent {settings.model} at {settings.base_url} needs an API "
                      f"key in the environment variable {settings.key_env}, which is not set")
    if (urllib.parse.urlparse(settings.base_url).scheme == "http"
            and not is_loopback(settings.base_url) and name not in _WARNED):
        _WARNED.add(name)
        sent = (f"its API key (${settings.key_env}) and " if settings.key_env else "")
        print(f"ub: warning: hosted opponent {settings.model} at {settings.base_url} is plain "
              f"http to another machine: {sent}every prompt and reply cross the network "
              "unencrypted; use an https:// URL", file=sys.stderr, flush=True)
    url = f"{settings.base_url}/models"
    try:
        httpx.get(url, timeout=min(settings.timeout, 10.0))
    except httpx.HTTPError as exc:
        raise UbError(f"hosted opponent endpoint {url} is unreachable ({type(exc).__name__}: "
                      f"{exc}); start the server or fix the URL") from None


class HostedActor(Actor):
    """A hosted endpoint in a seat (``hosted:MODEL@BASE_URL[?options]``): each turn's prompt
    goes to the endpoint in the rollout's hosted batch, which every hosted seat shares."""

    kind = "hosted"
    plays_offline = False

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.settings = parse_hosted(name)

    def check_ready(self) -> None:
        check_hosted(self.name)

    def environment_variables(self) -> list[str]:
        return [self.settings.key_env] if self.settings.key_env else []

    def take_turn(self, turn: Turn) -> Pending:
        batch = turn.rollout.batch(HostedBatch.KEY, HostedBatch)
        return batch.submit(self, turn)


class HostedBatch(Batch):
    """The hosted seats' requests of one rollout: a client (and thread pool) per endpoint
    name; answers are applied in game order, not completion order, so that the rows do not
    depend on timing."""

    KEY = "hosted"

    def __init__(self) -> None:
        self._clients: dict[str, HostedClient] = {}
        self._waiting: dict[Future, tuple[str, HostedActor, dict[str, Any], str]] = {}

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def submit(self, actor: HostedActor, turn: Turn) -> Pending:
        """Send ``turn``'s prompt to ``actor``'s endpoint."""
        client = self._clients.get(actor.name)
        if client is None:
            client = self._clients[actor.name] = HostedClient(actor.settings)
        template = get_template(turn.spec.template)
        # A chat endpoint applies its own chat template: send it the observation itself.
        prompt = (turn.game.observation if template.name == "chat"
                  else template.render(turn.game.observation, None))
        details = {"template": template.name, "prompt": prompt, "legal_moves_mode": "free",
                   "submitted": time.perf_counter()}
        self._waiting[client.submit(prompt)] = (turn.request_id, actor, details,
                                                turn.spec.extractor_name)
        return Pending(self, turn.request_id)

    def collect(self, block: bool) -> list[tuple[str, Move | MoveFailed]]:
        pending = self._waiting
        done = [f for f in pending if f.done()]
        if not done and block:
            done = list(wait_futures(list(pending), return_when=FIRST_COMPLETED).done)
        answers: list[tuple[str, Move | MoveFailed]] = []
        for future in sorted(done, key=lambda f: pending[f][0]):
            request_id, actor, details, extractor = pending.pop(future)
            try:
                text = future.result()
            except HostedFailure as exc:
                if actor.settings.on_failure == "error":
                    raise
                answers.append((request_id, MoveFailed(exc)))  # skip: the game is errored
                continue
            action, format_ok = get_extractor(extractor)(text)
            details.update(completion=text,
                           gen_seconds=time.perf_counter() - details.pop("submitted"))
            answers.append((request_id, Move(action, format_ok, details)))
        return answers

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
