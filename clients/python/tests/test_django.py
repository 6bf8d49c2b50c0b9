"""redis_rl.django in a real Django app, through Django's test client: the middleware from
settings, the view decorator on a function view and a class-based view, both on one request
(one set of header fields), hooks that get the HttpRequest, and the closed policy during an
outage. Exact counts, header fields and problem+json bodies, against real servers."""

import asyncio
import json
import types
import unittest

import django
import redis
import redis.asyncio
from django.conf import settings

if not settings.configured:
    settings.configure(DEBUG=False, SECRET_KEY="test", ALLOWED_HOSTS=["*"], INSTALLED_APPS=[],
                       MIDDLEWARE=[], ROOT_URLCONF=None, USE_TZ=True)
    django.setup()

from django.http import HttpResponse, JsonResponse  # noqa: E402  (after settings)
from django.core.exceptions import ImproperlyConfigured  # noqa: E402
from django.test import AsyncClient, Client, override_settings  # noqa: E402
from django.urls import path  # noqa: E402
from django.utils.decorators import method_decorator  # noqa: E402
from django.views import View  # noqa: E402

from redis_rl import Limit, Limiter  # noqa: E402
from redis_rl import asyncio as rl_asyncio  # noqa: E402
from redis_rl.django import limit_view  # noqa: E402
from servers import Server, free_port  # noqa: E402

LIMIT = Limit(rate=0.01, capacity=3)  # nothing refills while a test runs
MIDDLEWARE = ["redis_rl.django.RateLimitMiddleware"]


def expected(remaining, reset_s):
    return {"RateLimit-Policy": '"default";q=3;w=300', "RateLimit": f'"default";r={remaining};t={reset_s}',
            "X-RateLimit-Limit": "3", "X-RateLimit-Remaining": str(remaining),
            "X-RateLimit-Reset": str(reset_s)}


def rate_headers(response):
    return {k: v for k, v in response.headers.items() if "RateLimit" in k or k == "Retry-After"}


def urlconf(*patterns):
    module = types.ModuleType("urls")  # hashable, as Django's resolver cache needs
    module.urlpatterns = list(patterns)
    return module


def hello(request):
    return HttpResponse("hello")


class Django(unittest.TestCase):
    def limiter(self, port, **kwargs):
        kwargs.setdefault("on_error", "closed")
        limiter = Limiter(redis.Redis(port=port), **kwargs)
        self.addCleanup(limiter.client.close)
        return limiter

    def server(self, module=True):
        s = Server(module=module)
        self.addCleanup(s.close)
        return s

    def app(self, urls, middleware=None):
        """A Django test client for `urls`, with the middleware when its options are given."""
        overrides = {"ROOT_URLCONF": urls, "MIDDLEWARE": MIDDLEWARE if middleware else []}
        if middleware:
            overrides["REDIS_RL_MIDDLEWARE"] = middleware
        context = override_settings(**overrides)
        context.enable()
        self.addCleanup(context.disable)
        return Client(REMOTE_ADDR="203.0.113.7")

    def test_middleware_three_allowed_then_a_problem_429_on_module_and_lua(self):
        for module in (True, False):
            limiter = self.limiter(self.server(module).port)
            http = self.app(urlconf(path("", hello), path("health", hello)),
                            {"limiter": limiter, "limit": LIMIT,
                             "skip": lambda request: request.path == "/health"})
            got = [http.get("/") for _ in range(4)]
            self.assertEqual([r.status_code for r in got], [200, 200, 200, 429])
            self.assertEqual(got[0].content, b"hello")
            self.assertEqual(rate_headers(got[0]), expected(2, 100))
            denied = got[3]
            self.assertEqual(rate_headers(denied), {**expected(0, 300), "Retry-After": "100"})
            self.assertEqual(denied["Content-Type"], "application/problem+json")
            self.assertEqual(json.loads(denied.content)["detail"], "Rate limit exceeded; retry after 100 s.")
            self.assertEqual([(r.status_code, rate_headers(r)) for r in (http.get("/health") for _ in range(4))],
                             [(200, {})] * 4)
            self.assertEqual(limiter.path, "module" if module else "lua")

    def test_middleware_in_flight_limit_holds_a_streamed_response_until_closed(self):
        from django.http import StreamingHttpResponse

        s = self.server()
        limiter = self.limiter(s.port)
        key = "rl:http:inflight:1:ip:203.0.113.7"

        def held():
            with s.admin() as admin:
                return admin.execute_command("RL.LEASES", key, 10)[0]

        def stream(request):
            return StreamingHttpResponse(iter([b"one", b"two"]))

        def failing(request):
            raise RuntimeError("the view failed")

        http = self.app(urlconf(path("", stream), path("fail", failing)),
                        {"limiter": limiter, "in_flight": (1, 60_000)})
        first = http.get("/")
        self.assertEqual(first.status_code, 200)
        self.assertEqual(held(), 1)  # the body is not consumed, the response not closed
        second = http.get("/")
        self.assertEqual((second.status_code, second["Retry-After"]), (429, "60"))
        self.assertIn("Too many requests in flight", json.loads(second.content)["detail"])
        self.assertEqual(b"".join(first.streaming_content), b"onetwo")
        first.close()
        self.assertEqual(held(), 0)
        third = http.get("/")
        self.assertEqual(third.status_code, 200)
        third.close()
        http.raise_request_exception = False
        self.assertEqual(http.get("/fail").status_code, 500)  # Django's error response
        self.assertEqual(held(), 0)

    def test_view_decorator_with_hooks_of_the_request_and_a_custom_response(self):
        s = self.server()
        limiter = self.limiter(s.port)

        @limit_view(limiter, Limit(0.01, 2), key=lambda request: "user:" + request.GET.get("user", "anon"),
                    cost=lambda request: int(request.GET.get("cost", 1)),
                    on_limited=lambda request, d, headers: JsonResponse({"slow": "down"}, status=503,
                                                                        headers=dict(headers)))
        def search(request):
            return JsonResponse({"results": []})

        class Report(View):
            @method_decorator(limit_view(limiter, Limit(0.01, 1), prefix="report:"))
            def dispatch(self, request, *args, **kwargs):
                return super().dispatch(request, *args, **kwargs)

            def get(self, request):
                return HttpResponse("report")

        http = self.app(urlconf(path("search", search), path("report", Report.as_view())))
        got = [http.get("/search?user=alice") for _ in range(3)]
        self.assertEqual([r.status_code for r in got], [200, 200, 503])
        self.assertEqual(json.loads(got[0].content), {"results": []})
        self.assertEqual(got[1]["RateLimit"], '"default";r=0;t=200')
        self.assertEqual((json.loads(got[2].content), got[2]["Retry-After"]), ({"slow": "down"}, "100"))
        self.assertEqual(http.get("/search?user=bob&cost=2").status_code, 200)
        self.assertEqual([http.get("/report").status_code for _ in range(2)], [200, 429])
        raw = redis.Redis(port=s.port)
        self.assertEqual(sorted(k.decode() for k in raw.keys("*")),
                         ["report:ip:203.0.113.7", "rl:http:0.01:2:user:alice", "rl:http:0.01:2:user:bob"])

    def test_middleware_and_view_decorator_send_one_set_of_fields(self):
        limiter = self.limiter(self.server().port)
        view = limit_view(limiter, Limit(0.01, 5), policy_name="route", prefix="route:")(hello)
        http = self.app(urlconf(path("", view)), {"limiter": limiter, "limit": LIMIT})
        first = http.get("/")
        self.assertEqual(rate_headers(first), {
            "RateLimit-Policy": '"default";q=3;w=300, "route";q=5;w=500',
            "RateLimit": '"default";r=2;t=100, "route";r=4;t=100',
            "X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "2", "X-RateLimit-Reset": "100"})

    def test_middleware_and_view_decorator_keep_their_own_buckets_by_default(self):
        s = self.server()
        limiter = self.limiter(s.port)
        view = limit_view(limiter, Limit(0.01, 5), policy_name="route")(hello)
        http = self.app(urlconf(path("", view)), {"limiter": limiter, "limit": LIMIT})
        got = [http.get("/") for _ in range(4)]
        self.assertEqual([r.status_code for r in got], [200, 200, 200, 429])
        self.assertEqual(got[2]["RateLimit"], '"default";r=0;t=300, "route";r=2;t=300')
        self.assertEqual(sorted(k.decode() for k in redis.Redis(port=s.port).keys("*")),
                         ["rl:http:0.01:3:ip:203.0.113.7", "rl:http:0.01:5:ip:203.0.113.7"])

    def test_two_limits_on_one_redis_key_for_a_request_are_refused(self):
        limiter = self.limiter(self.server().port)
        view = limit_view(limiter, LIMIT)(hello)
        http = self.app(urlconf(path("", view)), {"limiter": limiter, "limit": LIMIT})
        with self.assertRaisesRegex(ValueError, "Redis key 'rl:http:0.01:3:ip:203.0.113.7' for one request"):
            http.get("/")

    def test_limit_per_request(self):
        plans = {"free": Limit(0.01, 1), "pro": Limit(0.01, 3)}
        limiter = self.limiter(self.server().port)
        http = self.app(urlconf(path("", hello)), {
            "limiter": limiter, "key": "header:X-User",
            "limit": lambda request: plans[request.headers.get("X-Plan", "free")]})
        self.assertEqual([http.get("/", headers={"X-User": "a"}).status_code for _ in range(2)], [200, 429])
        pro = [http.get("/", headers={"X-User": "b", "X-Plan": "pro"}).status_code for _ in range(4)]
        self.assertEqual(pro, [200, 200, 200, 429])

    def test_outage_applies_the_failure_policy(self):
        dead = free_port()
        closed = self.app(urlconf(path("", hello)), {"limiter": self.limiter(dead, timeout_ms=100), "limit": LIMIT})
        r = closed.get("/")
        self.assertEqual((r.status_code, rate_headers(r)), (429, {
            "RateLimit-Policy": '"default";q=3;w=300', "X-RateLimit-Limit": "3", "Retry-After": "1"}))
        opened = self.app(urlconf(path("", hello)), {
            "limiter": self.limiter(dead, on_error="open", timeout_ms=100), "limit": LIMIT})
        r = opened.get("/")
        self.assertEqual((r.status_code, rate_headers(r)), (200, {}))

    def test_async_hooks_in_the_middleware_are_run_not_skipped(self):
        # Before: an async `skip` returned a coroutine, which is true: every request passed.
        s = self.server()
        limiter = self.limiter(s.port)

        async def skip(request):
            await asyncio.sleep(0)
            return request.path == "/health"

        async def key(request):
            return "user:" + request.headers.get("X-User", "anon")

        async def limit(request):
            return LIMIT

        async def cost(request):
            return 1

        async def on_limited(request, decision, headers):
            return HttpResponse("slow down", status=503, headers=dict(headers))

        http = self.app(urlconf(path("", hello), path("health", hello)), {
            "limiter": limiter, "limit": limit, "skip": skip, "key": key, "cost": cost,
            "on_limited": on_limited})
        got = [http.get("/", headers={"X-User": "ann"}) for _ in range(4)]
        self.assertEqual([r.status_code for r in got], [200, 200, 200, 503])
        self.assertEqual(rate_headers(got[1]), expected(1, 200))
        self.assertEqual(got[3].content, b"slow down")
        self.assertEqual([http.get("/health").status_code for _ in range(4)], [200] * 4)
        self.assertEqual([k.decode() for k in redis.Redis(port=s.port).keys("*")], ["rl:http:0.01:3:user:ann"])

    def test_async_skip_on_a_sync_view(self):
        limiter = self.limiter(self.server().port)

        async def skip(request):
            return False

        http = self.app(urlconf(path("", limit_view(limiter, Limit(0.01, 2), skip=skip)(hello))))
        self.assertEqual([http.get("/").status_code for _ in range(3)], [200, 200, 429])

    def test_a_limiter_that_does_not_fit_the_view_is_refused(self):
        sync_limiter = self.limiter(free_port())
        async_limiter = rl_asyncio.Limiter(redis.asyncio.Redis(port=free_port()), on_error="closed")

        async def async_view(request):
            return HttpResponse("hello")

        with self.assertRaisesRegex(TypeError, "async_view is an async view, so the limiter must be "
                                               "redis_rl.asyncio.Limiter"):
            limit_view(sync_limiter, LIMIT)(async_view)
        with self.assertRaisesRegex(TypeError, "hello is a sync view, so the limiter must be the sync"):
            limit_view(async_limiter, LIMIT)(hello)
        http = self.app(urlconf(path("", hello)), {"limiter": async_limiter, "limit": LIMIT})
        with self.assertRaisesRegex(ImproperlyConfigured, "limiter must be the sync redis_rl.Limiter"):
            http.get("/")


class DjangoAsync(unittest.IsolatedAsyncioTestCase):
    """`limit_view` on async views, with `redis_rl.asyncio.Limiter`, through Django's
    AsyncClient (the ASGI handler on this test's event loop)."""

    async def test_async_view_three_allowed_then_429_with_async_hooks(self):
        s = Server()
        self.addCleanup(s.close)
        client = redis.asyncio.Redis(port=s.port)
        self.addAsyncCleanup(client.aclose)
        limiter = rl_asyncio.Limiter(client, on_error="closed")

        async def key(request):
            await asyncio.sleep(0)
            return "user:" + request.GET.get("user", "anon")

        async def skip(request):
            return request.GET.get("free") == "1"

        async def on_limited(request, decision, headers):
            return HttpResponse("slow down", status=503, headers=dict(headers))

        @limit_view(limiter, LIMIT, key=key, skip=skip)
        async def search(request):
            await asyncio.sleep(0)
            return HttpResponse("found")

        @limit_view(limiter, Limit(0.01, 1), prefix="report:", on_limited=on_limited)
        async def report(request):
            return HttpResponse("report")

        self.assertTrue(asyncio.iscoroutinefunction(search))
        context = override_settings(ROOT_URLCONF=urlconf(path("search", search), path("report", report)),
                                    MIDDLEWARE=[])
        context.enable()
        self.addCleanup(context.disable)
        http = AsyncClient()
        got = [await http.get("/search?user=ann") for _ in range(4)]
        self.assertEqual([r.status_code for r in got], [200, 200, 200, 429])
        self.assertEqual(got[0].content, b"found")
        self.assertEqual(rate_headers(got[0]), expected(2, 100))
        self.assertEqual(rate_headers(got[3]), {**expected(0, 300), "Retry-After": "100"})
        self.assertEqual(got[3]["Content-Type"], "application/problem+json")
        self.assertEqual([(await http.get("/search?user=ann&free=1")).status_code for _ in range(2)], [200] * 2)
        reports = [await http.get("/report") for _ in range(2)]
        self.assertEqual([(r.status_code, r.content) for r in reports], [(200, b"report"), (503, b"slow down")])
        raw = redis.Redis(port=s.port)
        self.addCleanup(raw.close)
        self.assertEqual(sorted(k.decode() for k in raw.keys("*")),
                         ["report:ip:127.0.0.1", "rl:http:0.01:3:user:ann"])  # AsyncClient's peer


if __name__ == "__main__":
    unittest.main()
