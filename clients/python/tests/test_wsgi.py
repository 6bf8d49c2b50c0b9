"""redis_rl.wsgi in a real Flask app, through Flask's test client: the middleware and the route
decorator against the module, the Lua fallback (a plain server) and an outage (a dead port).
Exact counts, header fields and problem+json bodies."""

import asyncio
import sys
import unittest

import flask
import redis
import redis.asyncio

from redis_rl import Limit, Limiter
from redis_rl import asyncio as rl_asyncio
from redis_rl.http import run_awaitable
from redis_rl.wsgi import RateLimitMiddleware, limit_route
from servers import Server, free_port

LIMIT = Limit(rate=0.01, capacity=3)  # nothing refills while a test runs


def expected(remaining, reset_s):
    return {"RateLimit-Policy": '"default";q=3;w=300', "RateLimit": f'"default";r={remaining};t={reset_s}',
            "X-RateLimit-Limit": "3", "X-RateLimit-Remaining": str(remaining),
            "X-RateLimit-Reset": str(reset_s)}


def rate_headers(response):
    return {k: v for k, v in response.headers.items() if "RateLimit" in k or k == "Retry-After"}


def flask_app(limiter, limit=LIMIT, **options):
    app = flask.Flask(__name__)

    @app.route("/")
    def hello():
        return "hello"

    @app.route("/health")
    def health():
        return "ok"

    app.wsgi_app = RateLimitMiddleware(app.wsgi_app, limiter=limiter, limit=limit, **options)
    return app


class Wsgi(unittest.TestCase):
    def limiter(self, port, **kwargs):
        kwargs.setdefault("on_error", "closed")
        kwargs.setdefault("timeout_ms", 1000)
        limiter = Limiter(redis.Redis(port=port), **kwargs)
        self.addCleanup(limiter.client.close)
        return limiter

    def server(self, module=True):
        s = Server(module=module)
        self.addCleanup(s.close)
        return s

    def test_three_allowed_then_a_problem_429_on_module_and_lua(self):
        for module in (True, False):
            limiter = self.limiter(self.server(module).port)
            http = flask_app(limiter).test_client()
            got = [http.get("/", environ_base={"REMOTE_ADDR": "203.0.113.7"}) for _ in range(4)]
            self.assertEqual([r.status_code for r in got], [200, 200, 200, 429])
            self.assertEqual(got[0].get_data(as_text=True), "hello")
            self.assertEqual(rate_headers(got[0]), expected(2, 100))
            self.assertEqual(rate_headers(got[3]), {**expected(0, 300), "Retry-After": "100"})
            self.assertEqual(got[3].headers["Content-Type"], "application/problem+json")
            self.assertEqual(got[3].get_json(force=True), {
                "type": "about:blank", "title": "Too Many Requests", "status": 429,
                "detail": "Rate limit exceeded; retry after 100 s."})
            self.assertEqual(limiter.path, "module" if module else "lua")

    def test_forwarded_for_only_from_trusted_proxies_and_skip(self):
        limiter = self.limiter(self.server().port)
        http = flask_app(limiter, trusted_proxies=["10.0.0.1"],
                         skip=lambda environ: environ["PATH_INFO"] == "/health").test_client()
        forged = {"REMOTE_ADDR": "203.0.113.7"}
        via_proxy = {"REMOTE_ADDR": "10.0.0.1"}
        for i in range(3):
            r = http.get("/", environ_base=forged, headers={"X-Forwarded-For": f"198.51.100.{i}"})
            self.assertEqual(r.headers["RateLimit"], f'"default";r={2 - i};t={100 * (i + 1)}')
        r = http.get("/", environ_base=via_proxy, headers={"X-Forwarded-For": "198.51.100.1"})
        self.assertEqual((r.status_code, r.headers["RateLimit"]), (200, '"default";r=2;t=100'))
        self.assertEqual([http.get("/health", environ_base=forged).status_code for _ in range(3)], [200] * 3)

    def test_outage_applies_the_failure_policy(self):
        dead = free_port()
        r = flask_app(self.limiter(dead, timeout_ms=100)).test_client().get("/")
        self.assertEqual((r.status_code, r.headers["Retry-After"]), (429, "1"))
        # "closed" knows the configured limit, not what is left: no remaining, no reset.
        self.assertEqual(rate_headers(r), {"RateLimit-Policy": '"default";q=3;w=300',
                                           "X-RateLimit-Limit": "3", "Retry-After": "1"})
        r = flask_app(self.limiter(dead, on_error="open", timeout_ms=100)).test_client().get("/")
        self.assertEqual((r.status_code, rate_headers(r)), (200, {}))
        http = flask_app(self.limiter(dead, on_error="local", timeout_ms=100)).test_client()
        got = [http.get("/") for _ in range(4)]
        self.assertEqual([r.status_code for r in got], [200, 200, 200, 429])
        self.assertEqual(rate_headers(got[1]), expected(1, 200))

    def test_route_decorator_limits_one_view_with_a_custom_response(self):
        limiter = self.limiter(self.server(module=False).port)
        app = flask.Flask(__name__)

        @app.route("/search")
        @limit_route(limiter, Limit(rate=0.01, capacity=2), key=lambda environ: "search",
                     on_limited=lambda environ, d, headers: flask.Response("busy", 503, headers))
        def search():
            return {"results": []}

        @app.route("/free")
        def free():
            return "free"

        http = app.test_client()
        got = [http.get("/search") for _ in range(3)]
        self.assertEqual([r.status_code for r in got], [200, 200, 503])
        self.assertEqual(got[0].get_json(), {"results": []})
        self.assertEqual(got[1].headers["RateLimit"], '"default";r=0;t=200')
        self.assertEqual((got[2].get_data(as_text=True), got[2].headers["Retry-After"]), ("busy", "100"))
        self.assertEqual([http.get("/free").status_code for _ in range(4)], [200] * 4)

    def test_limit_per_request(self):
        plans = {"free": Limit(0.01, 1), "pro": Limit(0.01, 3)}
        limiter = self.limiter(self.server().port)
        app = flask.Flask(__name__)
        app.route("/")(lambda: "hello")
        app.wsgi_app = RateLimitMiddleware(app.wsgi_app, limiter=limiter, key="header:X-User",
                                           limit=lambda environ: plans[environ.get("HTTP_X_PLAN", "free")])
        http = app.test_client()
        free = [http.get("/", headers={"X-User": "a"}).status_code for _ in range(2)]
        pro = [http.get("/", headers={"X-User": "b", "X-Plan": "pro"}) for _ in range(4)]
        self.assertEqual(free, [200, 429])
        self.assertEqual([r.status_code for r in pro], [200, 200, 200, 429])
        self.assertEqual(pro[0].headers["RateLimit-Policy"], '"default";q=3;w=300')

    def test_middleware_and_limit_route_send_one_set_of_fields(self):
        limiter = self.limiter(self.server().port)
        app = flask.Flask(__name__)

        @app.route("/")
        @limit_route(limiter, Limit(0.01, 5), policy_name="route", prefix="route:")
        def root():
            return "ok"

        app.wsgi_app = RateLimitMiddleware(app.wsgi_app, limiter=limiter, limit=LIMIT)
        first = app.test_client().get("/")
        self.assertEqual(first.status_code, 200)
        self.assertEqual(rate_headers(first), {
            "RateLimit-Policy": '"default";q=3;w=300, "route";q=5;w=500',
            "RateLimit": '"default";r=2;t=100, "route";r=4;t=100',
            "X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "2", "X-RateLimit-Reset": "100"})

    def test_middleware_and_limit_route_keep_their_own_buckets_by_default(self):
        s = self.server()
        limiter = self.limiter(s.port)
        app = flask.Flask(__name__)

        @app.route("/")
        @limit_route(limiter, Limit(0.01, 5), policy_name="route")
        def root():
            return "ok"

        app.wsgi_app = RateLimitMiddleware(app.wsgi_app, limiter=limiter, limit=LIMIT)
        got = [app.test_client().get("/") for _ in range(4)]
        self.assertEqual([r.status_code for r in got], [200, 200, 200, 429])
        self.assertEqual(got[2].headers["RateLimit"], '"default";r=0;t=300, "route";r=2;t=300')
        self.assertEqual(sorted(k.decode() for k in redis.Redis(port=s.port).keys("*")),
                         ["rl:http:0.01:3:ip:127.0.0.1", "rl:http:0.01:5:ip:127.0.0.1"])

    def test_two_limits_on_one_redis_key_for_a_request_are_refused(self):
        limiter = self.limiter(self.server().port)
        app = flask.Flask(__name__)
        app.testing = True  # the error reaches the test rather than becoming a 500

        @app.route("/")
        @limit_route(limiter, LIMIT, prefix="shared:")
        def root():
            return "ok"

        app.wsgi_app = RateLimitMiddleware(app.wsgi_app, limiter=limiter, limit=Limit(0.01, 9), prefix="shared:")
        with self.assertRaisesRegex(ValueError, "Redis key 'shared:ip:127.0.0.1' for one request"):
            app.test_client().get("/")

    def test_a_limit_function_that_gives_no_limit_is_named(self):
        limiter = self.limiter(self.server().port)
        app = flask.Flask(__name__)
        app.wsgi_app = RateLimitMiddleware(app.wsgi_app, limiter=limiter, limit=lambda environ: 5)
        with self.assertRaisesRegex(TypeError, "limit must be \\(or give\\) a redis_rl.Limit, got int"):
            app.test_client().get("/")

    def test_async_hooks_are_run_to_completion_not_skipped(self):
        # Before: an async `skip` returned a coroutine, which is true, so every request passed
        # unlimited; an async key, limit or cost was used as the coroutine itself.
        s = self.server()
        limiter = self.limiter(s.port)

        async def skip(environ):
            await asyncio.sleep(0)
            return environ["PATH_INFO"] == "/health"

        async def key(environ):
            return "user:" + environ.get("HTTP_X_USER", "anon")

        async def limit(environ):
            return LIMIT

        async def cost(environ):
            return 1

        async def on_limited(environ, decision, headers):
            return flask.Response("slow down", 503, headers)

        http = flask_app(limiter, skip=skip, key=key, limit=limit, cost=cost,
                         on_limited=on_limited).test_client()
        got = [http.get("/", headers={"X-User": "ann"}) for _ in range(4)]
        self.assertEqual([r.status_code for r in got], [200, 200, 200, 503])
        self.assertEqual(rate_headers(got[1]), expected(1, 200))
        self.assertEqual(got[3].get_data(as_text=True), "slow down")
        self.assertEqual([http.get("/health").status_code for _ in range(4)], [200] * 4)
        self.assertEqual([k.decode() for k in redis.Redis(port=s.port).keys("*")],
                         ["rl:http:0.01:3:user:ann"])

    def test_async_view_and_hooks_under_limit_route(self):
        limiter = self.limiter(self.server().port)
        app = flask.Flask(__name__)

        async def no_skip(environ):
            return False

        @app.route("/search")
        @limit_route(limiter, Limit(rate=0.01, capacity=2), skip=no_skip)
        async def search():
            await asyncio.sleep(0)
            return "found"

        http = app.test_client()
        got = [http.get("/search") for _ in range(3)]
        self.assertEqual([r.status_code for r in got], [200, 200, 429])
        self.assertEqual(got[0].get_data(as_text=True), "found")
        self.assertEqual(got[1].headers["RateLimit"], '"default";r=0;t=200')

    def test_an_asyncio_limiter_is_refused_at_construction(self):
        client = redis.asyncio.Redis(port=free_port())
        limiter = rl_asyncio.Limiter(client, on_error="closed")
        with self.assertRaisesRegex(TypeError, "limiter must be the sync redis_rl.Limiter"):
            RateLimitMiddleware(lambda environ, start: [], limiter=limiter, limit=LIMIT)
        with self.assertRaisesRegex(TypeError, "limiter must be the sync redis_rl.Limiter"):
            limit_route(limiter, LIMIT)


class RunAwaitable(unittest.TestCase):
    """`run_awaitable` without asgiref (its private event loop), in a plain thread and in one
    that already runs an event loop (where asyncio.run would refuse)."""

    def setUp(self):
        saved = {name: sys.modules.get(name) for name in ("asgiref", "asgiref.sync")}
        sys.modules["asgiref.sync"] = None  # `from asgiref.sync import ...` raises ImportError

        def restore():
            for name, module in saved.items():
                if module is None:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = module

        self.addCleanup(restore)

    def test_values_pass_through_and_awaitables_are_run(self):
        async def answer():
            await asyncio.sleep(0)
            return False

        self.assertEqual(run_awaitable(7), 7)
        self.assertIs(run_awaitable(answer()), False)

    def test_inside_a_running_loop(self):
        async def answer():
            return "ran"

        async def main():
            return run_awaitable(answer())

        self.assertEqual(asyncio.run(main()), "ran")

    def test_errors_reach_the_caller(self):
        async def boom():
            raise LookupError("hook failed")

        async def main():
            return run_awaitable(boom())

        with self.assertRaisesRegex(LookupError, "hook failed"):
            run_awaitable(boom())
        with self.assertRaisesRegex(LookupError, "hook failed"):
            asyncio.run(main())


if __name__ == "__main__":
    unittest.main()
