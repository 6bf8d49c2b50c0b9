//! Serves the example API on 127.0.0.1:8000 (REDIS_URL, default redis://127.0.0.1:6379).

use redis_rl_client::{Limit, OnError};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    // Built before anything waits on Redis, so a Redis still starting (or down) means the
    // policy's answers, not a service that exits.
    let limiter = redis_rl_examples::limiter(&url, OnError::Open)?;
    // A misconfigured Redis (a wrong password, a missing ACL rule, the wrong kind of client)
    // stops the service here with its cause; a Redis that is merely down does not.
    match limiter.check().await? {
        Some(path) => println!("Redis reached by the {} path", path.as_str()),
        None => println!("Redis does not answer yet: the policy decides until it does"),
    }
    let router = redis_rl_examples::api(limiter, Limit::new(1.0, 5.0)?, "rl:http:");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:8000").await?;
    println!("http://127.0.0.1:8000/ : 5 requests at once, then 1 per second per client address");
    redis_rl_examples::serve(listener, router).await?;
    Ok(())
}
