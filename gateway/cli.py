"""The ``switchyard`` command (also ``python -m gateway``).

- ``serve``: run the gateway (uvicorn, uvloop + httptools); the admin key is printed only when
  it was just generated. One gateway per DATA_DIR with the embedded Redis (a lock file).
- ``keys create|list|show|update|rotate|revoke``: talk to Redis directly through the same
  KeyStore the server uses (SWITCHYARD_REDIS_URL, or the embedded Redis under DATA_DIR, started
  for the command if the gateway is not running). Output is JSON.
- ``policy check FILE``: validate a routing policy; exit 0, or 1 naming the bad field.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import socket
import sys
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson
import redis

from gateway.api.admin import KeyCreate, KeyUpdate, RotateRequest, check_models, parse_payload
from gateway.data_dir import DataDirBusy, DataDirLock
from gateway.errors import GatewayError
from gateway.keys import KeyStore, PepperMismatch, check_pepper
from gateway.routing.policy import Policy, PolicyError, load_policy_file
from gateway.settings import Settings, SettingsError, ensure_secrets, load_settings
from gateway.store.connect import REDIS_FAILURES
from gateway.store.embedded import EmbeddedRedis
from gateway.usage_cli import add_usage_parser, run_usage_command

LIMIT_FLAGS = ("rpm", "tpm", "budget_usd", "budget_period", "expires_at")


def _print_json(data: Any) -> None:
    print(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())


def _fail(message: str, code: int = 1) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


# -- serve ---------------------------------------------------------------------------------


def _listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything starts: a busy port fails at once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


class _RefusedStartFilter(logging.Filter):
    """A start refused with a reason (``app.state.startup_error``) is said in one line, not
    with the traceback uvicorn would print for it."""

    def __init__(self, app: Any) -> None:
        super().__init__()
        self._app = app

    def filter(self, record: logging.LogRecord) -> bool:
        refused = self._app.state.startup_error is not None
        return not (refused and str(record.msg).startswith("Traceback"))


def serve(settings: Settings, workers: int) -> int:
    """Run the gateway. In order, each failing fast with one line on stderr: the policy file,
    the DATA_DIR lock (a second gateway on it names the first's pid), the secrets, the port;
    only then the app (embedded Redis included) starts."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    from gateway.app import create_app
    from gateway.logs import configure_process_logging
    from gateway.server.http_guard import guarded_protocol

    configure_process_logging(settings.log_level, settings.log_format)
    try:
        load_policy_file(settings.policy_file)
    except PolicyError as exc:
        return _fail(f"policy {settings.policy_file}: {exc}")
    if workers > 1 and settings.embedded_redis:
        return _fail("--workers > 1 needs SWITCHYARD_REDIS_URL (one shared Redis)")
    lock = DataDirLock(settings.data_dir)
    try:
        # Exclusive with the embedded Redis (one owner of its AOF); shared with an external one.
        lock.acquire(exclusive=settings.embedded_redis)
    except DataDirBusy as exc:
        return _fail(str(exc))
    with lock:
        secrets = ensure_secrets(settings)
        if settings.admin_key is not None:
            print("Admin key: (from SWITCHYARD_ADMIN_KEY)", flush=True)
        elif secrets.admin_key_generated:  # shown once, like an API key
            print(f"Admin key (generated now): {secrets.admin_key}", flush=True)
            print(f"  stored in {settings.data_dir / 'admin_key'} (mode 0600)", flush=True)
        else:
            print(f"Admin key: in {settings.data_dir / 'admin_key'}", flush=True)
        try:
            sock = _listen(settings.host, settings.port)
        except OSError as exc:
            return _fail(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror}")
        redis_note = settings.redis_url or f"embedded, data in {settings.redis_dir}"
        print(
            f"Switchyard on http://{settings.host}:{settings.port} (Redis: {redis_note})",
            flush=True,
        )
        options: dict[str, Any] = {
            "loop": "uvloop",
            "access_log": False,
            "log_level": "warning",
            "http": guarded_protocol(settings),  # each worker's own app: no on_reject hook
            "timeout_keep_alive": settings.keep_alive_timeout_s,
            # SIGTERM drains in the app first (shutdown_grace_s); this only bounds what is left.
            "timeout_graceful_shutdown": 2,
        }
        with sock:
            if workers > 1:
                config = uvicorn.Config(
                    "gateway.app:create_app_from_env", factory=True, workers=workers, **options
                )
                Multiprocess(config, sockets=[sock]).run()
                return 0
            app = create_app(settings)
            options["http"] = guarded_protocol(settings, app.state.record_wire_rejection)
            server = uvicorn.Server(uvicorn.Config(app, **options))
            logging.getLogger("uvicorn.error").addFilter(_RefusedStartFilter(app))
            try:
                server.run(sockets=[sock])
            except SystemExit:
                if server.started:
                    raise
            if not server.started:
                reason = app.state.startup_error or "see the log above"
                return _fail(f"the gateway did not start: {reason}", 3)
    return 0


# -- keys ----------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _key_store(settings: Settings) -> AsyncIterator[KeyStore]:
    from gateway.store.connect import connect_redis

    secrets = ensure_secrets(settings)
    embedded: EmbeddedRedis | None = None
    lock = DataDirLock(settings.data_dir)
    url = settings.redis_url
    if not url:
        server = EmbeddedRedis(settings.redis_dir)
        url = server.url
        if not _answers(server):
            # The gateway is not running: own DATA_DIR and start Redis for this command.
            lock.acquire(exclusive=True)
            embedded = server
            await asyncio.to_thread(server.start)
    client = connect_redis(url, settings.redis_timeout_s)
    try:
        try:
            await check_pepper(client, secrets.key_pepper)
        except PepperMismatch as exc:
            raise SettingsError(str(exc)) from None
        yield KeyStore(client, secrets.key_pepper)
    finally:
        await client.aclose()
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
        lock.release()


def _answers(server: EmbeddedRedis) -> bool:
    if not server.socket_path.exists():
        return False
    try:
        client = redis.Redis(unix_socket_path=str(server.socket_path), socket_timeout=1)
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False


def _fields_from_args(args: argparse.Namespace) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for name in ("name", "team", *LIMIT_FLAGS):
        value = getattr(args, name, None)
        if value is not None:
            fields[name] = value
    if args.models is not None:
        fields["models"] = [m.strip() for m in args.models.split(",") if m.strip()]
    if args.metadata:
        metadata: dict[str, str] = {}
        for item in args.metadata:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise GatewayError(f"metadata: expected KEY=VALUE, got {item!r}", param="metadata")
            metadata[key] = value
        fields["metadata"] = metadata
    for name in getattr(args, "clear", None) or []:
        fields[name] = None
    return fields


def _policy_or_none(settings: Settings) -> Policy | None:
    try:
        return load_policy_file(settings.policy_file)
    except PolicyError:
        return None


async def _keys_command(settings: Settings, args: argparse.Namespace) -> int:
    async with _key_store(settings) as store:
        command = args.keys_command
        if command == "create":
            payload = parse_payload(KeyCreate, _fields_from_args(args))
            check_models(_policy_or_none(settings), payload.models)
            fields = payload.model_dump()
            if fields["budget_usd"] is not None and fields["budget_period"] is None:
                fields["budget_period"] = "month"
            fields["metadata"] = fields["metadata"] or {}
            created = await store.create(fields)
            _print_json({**created.record.public_view(), "key": created.key})
            print("Store the key now: it is not shown again.", file=sys.stderr)
            return 0
        if command == "list":
            page = await store.list(limit=args.limit, team=args.team, status=args.status)
            _print_json([record.public_view() for record in page.records])
            return 0
        if command == "show":
            record = await store.get(args.id)
            if record is None:
                return _fail(f"no key with id {args.id!r}")
            _print_json(record.public_view())
            return 0
        if command == "update":
            changes = _fields_from_args(args)
            if not changes:
                return _fail("nothing to update: pass at least one field flag or --clear")
            payload = parse_payload(KeyUpdate, changes)
            check_models(_policy_or_none(settings), payload.models)
            updated = await store.update(args.id, {n: getattr(payload, n) for n in changes})
            if updated is None:
                return _fail(f"no key with id {args.id!r}")
            _print_json(updated.public_view())
            return 0
        if command == "rotate":
            request = parse_payload(RotateRequest, {"grace_seconds": args.grace_seconds})
            outcome = await store.rotate(
                args.id, float(request.grace_seconds), args.idempotency_key
            )
            if outcome.created is None:
                return _fail(f"cannot rotate {args.id!r}: {outcome.status}")
            _print_json({**outcome.created.record.public_view(), "key": outcome.created.key})
            return 0
        if command == "revoke":
            record = await store.revoke(args.id)
            if record is None:
                return _fail(f"no key with id {args.id!r}")
            _print_json(record.public_view())
            return 0
    return _fail(f"unknown keys command {args.keys_command!r}")


# -- policy --------------------------------------------------------------------------------


def policy_check(path: str) -> int:
    try:
        policy = load_policy_file(path)
    except PolicyError as exc:
        where = exc.path or "(file)"
        return _fail(f"{path}: {where}: {exc.message}")
    print(
        f"ok: {path}: {len(policy.providers)} providers, {len(policy.models)} models, "
        f"{len(policy.aliases)} aliases"
    )
    return 0


# -- parser --------------------------------------------------------------------------------


def _add_key_fields(parser: argparse.ArgumentParser, update: bool) -> None:
    parser.add_argument("--name")
    parser.add_argument("--team")
    parser.add_argument("--models", help="comma-separated allow-list of models or aliases")
    parser.add_argument("--rpm", type=int, help="requests per minute")
    parser.add_argument("--tpm", type=int, help="tokens per minute")
    parser.add_argument("--budget-usd", dest="budget_usd", type=float)
    parser.add_argument("--budget-period", dest="budget_period", help="day | month | total")
    parser.add_argument(
        "--expires-at", dest="expires_at", help="ISO 8601 date-time or unix timestamp"
    )
    parser.add_argument("--metadata", action="append", metavar="KEY=VALUE")
    if update:
        parser.add_argument(
            "--clear",
            action="append",
            choices=["name", "team", "models", *LIMIT_FLAGS],
            help="remove a field (e.g. --clear rpm)",
        )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="switchyard", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve", help="run the gateway")
    serve_parser.add_argument("--workers", type=int, default=1)

    keys = commands.add_parser("keys", help="manage API keys (directly in Redis)")
    key_commands = keys.add_subparsers(dest="keys_command", required=True)
    _add_key_fields(key_commands.add_parser("create", help="create a key"), update=False)
    list_parser = key_commands.add_parser("list", help="list keys")
    list_parser.add_argument("--team")
    list_parser.add_argument("--status", choices=["active", "revoked", "expired"])
    list_parser.add_argument("--limit", type=int, default=100)
    key_commands.add_parser("show", help="show one key").add_argument("id")
    update_parser = key_commands.add_parser("update", help="change a key's fields")
    update_parser.add_argument("id")
    _add_key_fields(update_parser, update=True)
    rotate_parser = key_commands.add_parser("rotate", help="issue a new secret")
    rotate_parser.add_argument("id")
    rotate_parser.add_argument("--grace-seconds", dest="grace_seconds", type=float, default=0)
    rotate_parser.add_argument("--idempotency-key", dest="idempotency_key")
    key_commands.add_parser("revoke", help="revoke a key").add_argument("id")

    policy = commands.add_parser("policy", help="routing policy tools")
    policy_commands = policy.add_subparsers(dest="policy_command", required=True)
    policy_commands.add_parser("check", help="validate a policy file").add_argument("file")
    add_usage_parser(commands)
    return parser


async def _usage_command(settings: Settings, args: argparse.Namespace) -> int:
    async with _key_store(settings) as store:  # the same Redis rules as `keys`
        return await run_usage_command(store.redis, args)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "policy":
        return policy_check(args.file)
    try:
        settings = load_settings()
    except SettingsError as exc:
        return _fail(str(exc), 2)
    try:
        if args.command == "serve":
            return serve(settings, args.workers)
        if args.command == "usage":
            return asyncio.run(_usage_command(settings, args))
        return asyncio.run(_keys_command(settings, args))
    except SettingsError as exc:
        return _fail(str(exc), 2)
    except DataDirBusy as exc:
        return _fail(str(exc))
    except GatewayError as exc:
        return _fail(exc.message)
    except REDIS_FAILURES as exc:
        return _fail(f"cannot reach Redis: {exc}")


if __name__ == "__main__":
    sys.exit(main())
