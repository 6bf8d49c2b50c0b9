//! Criterion micro-benchmark of the pure bucket math (no Redis): what one RL.ACQUIRE spends
//! deciding, apart from parsing, key lookup and reply. Run with `make bench-math`
//! (`cargo bench --features system-alloc`: Redis's allocator does not exist outside Redis).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use redis_rl::args;
use rl_bucket::{acquire, peek, Cost, Limit, State};

const NOW_US: u64 = 1_800_000_000_000_000;

fn bucket_math(c: &mut Criterion) {
    let limit = Limit::new(100.0, 1000.0).expect("valid limit");
    let mut group = c.benchmark_group("bucket");

    group.bench_function("acquire/missing key (full bucket)", |b| {
        b.iter(|| {
            acquire(
                black_box(&limit),
                black_box(None),
                black_box(NOW_US),
                Cost::ONE,
            )
        })
    });

    // A bucket half drained, so the call takes and writes a new state.
    let half = State::from_full_at_ns(NOW_US * 1_000 + 5_000_000_000);
    group.bench_function("acquire/allowed", |b| {
        b.iter(|| {
            acquire(
                black_box(&limit),
                black_box(half),
                black_box(NOW_US),
                Cost::ONE,
            )
        })
    });

    // An empty bucket: the denied path, which changes nothing.
    let empty = State::from_full_at_ns(NOW_US * 1_000 + 10_000_000_000);
    group.bench_function("acquire/denied", |b| {
        b.iter(|| {
            acquire(
                black_box(&limit),
                black_box(empty),
                black_box(NOW_US),
                Cost::ONE,
            )
        })
    });

    group.bench_function("peek", |b| {
        b.iter(|| {
            peek(
                black_box(&limit),
                black_box(half),
                black_box(NOW_US),
                Cost::ONE,
            )
        })
    });

    // A caller hammering one bucket: each call feeds the next its state (governor's
    // iter_batched pattern keeps the setup out of the measurement).
    group.bench_function("acquire/sequence of 1000", |b| {
        b.iter_batched(
            || (None::<State>, NOW_US),
            |(mut state, mut now_us)| {
                for _ in 0..1000 {
                    let (_, next) = acquire(&limit, state, now_us, Cost::ONE);
                    state = next.or(state);
                    now_us += 3_000;
                }
                state
            },
            BatchSize::SmallInput,
        )
    });

    // At 3/s every state carries a fraction of a ns: the exact path with its decoding.
    let limit_3 = Limit::new(3.0, 1000.0).expect("valid limit");
    let (_, half_3) = acquire(&limit_3, None, NOW_US, Cost::new(500.0).expect("cost"));
    group.bench_function("acquire/allowed at 3/s (state with a fraction)", |b| {
        b.iter(|| {
            acquire(
                black_box(&limit_3),
                black_box(half_3),
                black_box(NOW_US),
                Cost::ONE,
            )
        })
    });
    group.bench_function("parse/limit at 3/s (exact T as a fraction)", |b| {
        b.iter(|| Limit::new(black_box(3.0), black_box(1000.0)))
    });

    group.bench_function("parse/rate capacity cost", |b| {
        b.iter(|| args::acquire(black_box(b"100"), black_box(b"1000"), black_box(Some(b"1"))))
    });
    group.bench_function("parse/decimal forms", |b| {
        b.iter(|| {
            args::acquire(
                black_box(b"0.5"),
                black_box(b"2.5e3"),
                black_box(Some(b"0.25")),
            )
        })
    });
    group.finish();
}

criterion_group!(benches, bucket_math);
criterion_main!(benches);
