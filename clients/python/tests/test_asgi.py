"""redis_rl.asgi in real Starlette and FastAPI apps, driven through httpx's ASGI transport:
against the module, the Lua fallback (a plain server) and an outage (a dead port). Exact
counts, header fields and problem+json bodies."""

import json
import unittest

import httpx
import redis.asyncio
from fastapi import FastAPI, Request
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from redis_rl import Limit
from redis_rl.asgi import RateLimitMiddleware, limit_route
from redis_rl.asyncio import Limiter
from servers import Server, free_port

# 3 requests of burst, one more each 100 s: nothing refills while a test runs.
LIMIT = Limit(rate=0.01, capacity=3)


def expected(remaining, reset_s, legacy=True):
    h = {"ratelimit-policy": '"default";q=3;w=300', "ratelimit": f'"default";r={remaining};t={reset_s}'}
    if legacy:
        h.update({"x-ratelimit-limit": "3", "x-ratelimit-remaining": str(remaining),
                  "x-ratelimit-reset": str(reset_s)})
    return h


def rate_headers(response):
    return {k: v for k, v in response.headers.items() if "ratelimit" in k or k == "retry-after"}


def starlette_app(limiter, **options):
    async def hello(request):
        return PlainTextResponse("hello")

    app = Starlette(routes=[Route("/", hello), Route("/health", hello)])
    app.add_middleware(RateLimitMiddleware, limiter=limiter, limit=LIMIT, **options)
    return app


class AsgiBase(unittest.IsolatedAsyncioTestCase):
    async def limiter(self, port, **kwargs):
        client = redis.asyncio.Redis(port=port)
        self.addAsyncCleanup(client.aclose)
        kwargs.setdefault("on_error", "closed")
        kwargs.setdefault("timeout_ms", 1000)
        return Limiter(client, **kwargs)

    def server(self, module=True):
        s = Server(module=module)
        self.addCleanup(s.close)
        return s

    async def http(self, app, client=("203.0.113.7", 5000)):
        c = httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=client), base_url="http://t")
        self.addAsyncCleanup(c.aclose)
        return c


class Asgi(AsgiBase):
    async def test_three_allowed_then_a_problem_429_on_module_and_lua(self):
        for module in (True, False):
            limiter = await self.limiter(self.server(module).port)
            http = await self.http(starlette_app(limiter))
            got = [await http.get("/") for _ in range(4)]
            self.assertEqual([r.status_code for r in got], [200, 200, 200, 429])
            self.assertEqual(got[0].text, "hello")
            self.assertEqual(rate_headers(got[0]), expected(2, 100))
            self.assertEqual(rate_headers(got[2]), expected(0, 300))
            denied = got[3]
            self.assertEqual(rate_headers(denied), {**expected(0, 300), "retry-after": "100"})
            self.assertEqual(denied.headers["content-type"], "application/problem+json")
            self.assertEqual(denied.json(), {"type": "about:blank", "title": "Too Many Requests",
                                             "status": 429, "detail": "Rate limit exceeded; retry after 100 s."})
            self.assertEqual(limiter.path, "module" if module else "lua")

    async def test_keys_by_client_address_and_trusts_forwarded_for_only_from_listed_proxies(self):
        limiter = await self.limiter(self.server().port)
        app = starlette_app(limiter, trusted_proxies=["10.0.0.0/8"])
        direct = await self.http(app, client=("203.0.113.7", 1))
        proxy = await self.http(app, client=("10.1.2.3", 1))
        for _ in range(3):
            self.assertEqual((await direct.get("/", headers={"X-Forwarded-For": "198.51.100.1"})).status_code, 200)
        # The untrusted peer's X-Forwarded-For was ignored: its own bucket is empty.
        self.assertEqual((await direct.get("/", headers={"X-Forwarded-For": "198.51.100.2"})).status_code, 429)
        # Through the trusted proxy, each forwarded client has its own bucket; a forged hop
        # to the left of the proxy's is not believed.
        r = await proxy.get("/", headers={"X-Forwarded-For": "203.0.113.7, 198.51.100.9, 10.9.9.9"})
        self.assertEqual((r.status_code, r.headers["ratelimit"]), (200, '"default";r=2;t=100'))
        r = await proxy.get("/", headers={"X-Forwarded-For": "198.51.100.9"})
        self.assertEqual(r.headers["ratelimit"], '"default";r=1;t=200')
        raw = redis.Redis(port=limiter.client.connection_pool.connection_kwargs["port"])
        self.assertEqual(sorted(k.decode() for k in raw.keys("rl:http:*")),
                         ["rl:http:0.01:3:ip:198.51.100.9", "rl:http:0.01:3:ip:203.0.113.7"])

    async def test_header_key_cost_skip_custom_response_and_no_legacy_headers(self):
        limiter = await self.limiter(self.server().port)

        def on_limited(scope, decision, headers):
            return JSONResponse({"slow": "down", "wait_ms": decision.retry_after_ms > 0}, 429,
                                headers=dict(headers))

        app = starlette_app(limiter, key="header:X-Api-Key", cost=lambda scope: 2,
                            skip=lambda scope: scope["path"] == "/health", legacy_headers=False,
                            on_limited=on_limited)
        http = await self.http(app)
        first = await http.get("/", headers={"X-Api-Key": "alice"})
        self.assertEqual(rate_headers(first), expected(1, 200, legacy=False))
        second = await http.get("/", headers={"X-Api-Key": "alice"})
        self.assertEqual((second.status_code, second.json()), (429, {"slow": "down", "wait_ms": True}))
        self.assertEqual(second.headers["retry-after"], "100")
        self.assertEqual((await http.get("/", headers={"X-Api-Key": "bob"})).status_code, 200)
        health = [await http.get("/health", headers={"X-Api-Key": "alice"}) for _ in range(3)]
        self.assertEqual([(r.status_code, rate_headers(r)) for r in health], [(200, {})] * 3)

    async def test_the_shield_answers_a_flood_without_redis(self):
        s = self.server()
        http = await self.http(starlette_app(await self.limiter(s.port, deny_cache=True)))
        got = [await http.get("/") for _ in range(10)]
        self.assertEqual([r.status_code for r in got], [200] * 3 + [429] * 7)
        # The first denial came from Redis; the six after it from the deny cache, with the
        # same fields (the wait counts down from the denial, so it still rounds up to 100 s).
        for r in got[3:]:
            self.assertEqual(rate_headers(r), {**expected(0, 300), "retry-after": "100"})
        self.assertEqual(s.calls("rl.acquire"), 4)

    async def test_outage_applies_the_failure_policy(self):
        dead = free_port()
        closed = await self.http(starlette_app(await self.limiter(dead, timeout_ms=100)))
        r = await closed.get("/")
        self.assertEqual((r.status_code, r.headers["retry-after"]), (429, "1"))
        # "closed" knows the configured limit, not what is left: no RateLimit, no remaining,
        # no reset (they would claim an empty bucket full again at once).
        self.assertEqual(rate_headers(r), {"ratelimit-policy": '"default";q=3;w=300',
                                           "x-ratelimit-limit": "3", "retry-after": "1"})
        self.assertEqual(r.json()["detail"], "Rate limit exceeded; retry after 1 s.")
        opened = await self.http(starlette_app(await self.limiter(dead, on_error="open", timeout_ms=100)))
        r = await opened.get("/")
        self.assertEqual((r.status_code, rate_headers(r)), (200, {}))
        local = await self.http(starlette_app(await self.limiter(dead, on_error="local", timeout_ms=100)))
        got = [await local.get("/") for _ in range(4)]
        self.assertEqual([r.status_code for r in got], [200, 200, 200, 429])
        self.assertEqual(rate_headers(got[0]), expected(2, 100))

    async def test_fastapi_app_and_a_single_limited_route(self):
        limiter = await self.limiter(self.server().port)
        app = FastAPI()

        @app.get("/limited")
        @limit_route(limiter, Limit(rate=0.01, capacity=1))
        async def limited(request: Request):
            return PlainTextResponse("ok")

        @app.get("/free")
        async def free():
            return {"free": True}

        http = await self.http(app)
        first = await http.get("/limited")
        self.assertEqual((first.status_code, first.text, first.headers["ratelimit"]),
                         (200, "ok", '"default";r=0;t=100'))
        self.assertEqual(first.headers["ratelimit-policy"], '"default";q=1;w=100')
        second = await http.get("/limited")
        self.assertEqual((second.status_code, second.headers["retry-after"]), (429, "100"))
        self.assertEqual(json.loads(second.content)["status"], 429)
        self.assertEqual([(await http.get("/free")).status_code for _ in range(5)], [200] * 5)

        mounted = FastAPI()
        mounted.add_middleware(RateLimitMiddleware, limiter=limiter, limit=LIMIT, prefix="fa:")

        @mounted.get("/")
        async def root():
            return {"hello": "world"}

        http = await self.http(mounted)
        got = [await http.get("/") for _ in range(4)]
        self.assertEqual([r.status_code for r in got], [200, 200, 200, 429])
        self.assertEqual(got[0].json(), {"hello": "world"})
        self.assertEqual(rate_headers(got[1]), expected(1, 200))


class AsgiHooks(AsgiBase):
    """Every hook may be async; limits per request; limit_route on any endpoint; one set of
    header fields when several limits decide a request."""

    async def test_async_hooks_are_awaited(self):
        s = self.server()
        limiter = await self.limiter(s.port)
        seen = []

        async def key(scope):
            return "user:" + dict(scope["headers"]).get(b"x-user", b"anon").decode()

        async def cost(scope):
            return 1

        async def skip(scope):
            return scope["path"] == "/health"

        async def on_limited(scope, decision, headers):
            seen.append(decision.remaining)
            return JSONResponse({"limited": True}, 429, headers=dict(headers))

        http = await self.http(starlette_app(limiter, key=key, cost=cost, skip=skip, on_limited=on_limited))
        got = [await http.get("/", headers={"X-User": "alice"}) for _ in range(4)]
        self.assertEqual([r.status_code for r in got], [200, 200, 200, 429])
        self.assertEqual(got[3].json(), {"limited": True})
        self.assertEqual(seen, [0])
        self.assertEqual([(await http.get("/health")).status_code for _ in range(5)], [200] * 5)
        # One bucket for the user, not one per request named after an unawaited coroutine.
        raw = redis.Redis(port=s.port)
        self.assertEqual([k.decode() for k in raw.keys("rl:http:*")], ["rl:http:0.01:3:user:alice"])

    async def test_limit_per_request_sync_and_async(self):
        plans = {"free": Limit(0.01, 1), "pro": Limit(0.01, 3)}

        def plan(scope):
            return plans[dict(scope["headers"]).get(b"x-plan", b"free").decode()]

        async def plan_async(scope):
            return plan(scope)

        for limit in (plan, plan_async):
            limiter = await self.limiter(self.server().port)
            app = Starlette(routes=[Route("/", lambda request: PlainTextResponse("hello"))])
            app.add_middleware(RateLimitMiddleware, limiter=limiter, limit=limit, key="header:X-User")
            http = await self.http(app)
            free = [(await http.get("/", headers={"X-User": "a", "X-Plan": "free"})).status_code for _ in range(2)]
            pro = [await http.get("/", headers={"X-User": "b", "X-Plan": "pro"}) for _ in range(4)]
            self.assertEqual(free, [200, 429], limit)
            self.assertEqual([r.status_code for r in pro], [200, 200, 200, 429], limit)
            self.assertEqual(pro[0].headers["ratelimit-policy"], '"default";q=3;w=300', limit)

    async def test_limit_route_on_a_plain_def_and_any_request_parameter_name(self):
        limiter = await self.limiter(self.server().port)
        app = FastAPI()

        @app.get("/def")
        @limit_route(limiter, Limit(0.01, 1), prefix="def:")
        def plain(request: Request):
            return JSONResponse({"plain": True})

        @app.get("/named")
        @limit_route(limiter, Limit(0.01, 1), prefix="named:")
        async def named(req: Request, q: int = 0):
            return JSONResponse({"q": q, "path": req.url.path})

        @app.get("/none")
        @limit_route(limiter, Limit(0.01, 1), prefix="none:")
        def none(q: int = 0):
            return PlainTextResponse(str(q))

        http = await self.http(app)
        for path, body in (("/def", '{"plain":true}'), ("/named?q=7", '{"q":7,"path":"/named"}'),
                           ("/none?q=3", "3")):
            first = await http.get(path)
            self.assertEqual((first.status_code, first.text, first.headers["ratelimit"]),
                             (200, body, '"default";r=0;t=100'), path)
            second = await http.get(path)
            self.assertEqual((second.status_code, second.headers["retry-after"]), (429, "100"), path)

    async def test_middleware_and_limit_route_send_one_set_of_fields(self):
        limiter = await self.limiter(self.server().port)
        app = FastAPI()
        app.add_middleware(RateLimitMiddleware, limiter=limiter, limit=Limit(0.01, 3))

        @app.get("/")
        @limit_route(limiter, Limit(0.01, 5), policy_name="route", prefix="route:")
        async def root(request: Request):
            return PlainTextResponse("ok")

        http = await self.http(app)
        first = await http.get("/")
        self.assertEqual(first.status_code, 200)
        # Both limits as the draft's lists; X-RateLimit-* of the tighter (2 left of 3, not 4 of 5).
        self.assertEqual(rate_headers(first), {
            "ratelimit-policy": '"default";q=3;w=300, "route";q=5;w=500',
            "ratelimit": '"default";r=2;t=100, "route";r=4;t=100',
            "x-ratelimit-limit": "3", "x-ratelimit-remaining": "2", "x-ratelimit-reset": "100"})
        got = [await http.get("/") for _ in range(3)]
        self.assertEqual([r.status_code for r in got], [200, 200, 429])
        # The middleware denied before the route ran: its fields alone.
        self.assertEqual(rate_headers(got[2]), {**expected(0, 300), "retry-after": "100"})

    async def test_middleware_and_limit_route_keep_their_own_buckets_by_default(self):
        # No prefix on either: each limit has its own key space, so the route's 5 are not
        # spent by the middleware's takes (one shared bucket answered r=3 for the route).
        limiter = await self.limiter(self.server().port)
        app = FastAPI()
        app.add_middleware(RateLimitMiddleware, limiter=limiter, limit=Limit(0.01, 3))

        @app.get("/")
        @limit_route(limiter, Limit(0.01, 5), policy_name="route")
        async def root(request: Request):
            return PlainTextResponse("ok")

        http = await self.http(app)
        got = [await http.get("/") for _ in range(4)]
        self.assertEqual([r.status_code for r in got], [200, 200, 200, 429])
        self.assertEqual([r.headers["ratelimit"] for r in got[:3]],
                         [f'"default";r={2 - i};t={100 * (i + 1)}, "route";r={4 - i};t={100 * (i + 1)}' for i in range(3)])
        raw = redis.Redis(port=limiter.client.connection_pool.connection_kwargs["port"])
        self.assertEqual(sorted(k.decode() for k in raw.keys("*")),
                         ["rl:http:0.01:3:ip:203.0.113.7", "rl:http:0.01:5:ip:203.0.113.7"])

    async def test_two_limits_on_one_redis_key_for_a_request_are_refused(self):
        limiter = await self.limiter(self.server().port)
        app = FastAPI()
        app.add_middleware(RateLimitMiddleware, limiter=limiter, limit=Limit(0.01, 3))

        @app.get("/")
        @limit_route(limiter, Limit(0.01, 3))
        async def root(request: Request):
            return PlainTextResponse("ok")

        http = await self.http(app)
        with self.assertRaisesRegex(ValueError, "two rate limits use the Redis key "
                                    "'rl:http:0.01:3:ip:203.0.113.7' for one request.*own prefix"):
            await http.get("/")


if __name__ == "__main__":
    unittest.main()
