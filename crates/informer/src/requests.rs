//! Requests made to an API server, counted by HTTP method and response code as
//! client-go's `rest_client_requests_total` counts them: a tower layer on the kube
//! client's stack, so discovery, lists, watches and version checks are all counted.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

/// Requests made to one cluster, by (method, code); `code` is the HTTP status, or
/// `<error>` when no response came (refused, reset, timed out).
#[derive(Debug, Default)]
pub struct RequestCounts {
    counts: Mutex<BTreeMap<(String, String), u64>>,
}

impl RequestCounts {
    /// Counts one request.
    pub fn record(&self, method: &str, code: &str) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        match counts.get_mut(&(method.to_string(), code.to_string())) {
            Some(n) => *n += 1,
            None => {
                counts.insert((method.to_string(), code.to_string()), 1);
            }
        }
    }

    /// Every (method, code) with its count, in order.
    pub fn snapshot(&self) -> Vec<(String, String, u64)> {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|((m, c), n)| (m.clone(), c.clone(), *n))
            .collect()
    }
}

/// Counts each request through a service into [`RequestCounts`].
#[derive(Debug, Clone)]
pub struct CountLayer(pub Arc<RequestCounts>);

impl<S> tower::Layer<S> for CountLayer {
    type Service = Counted<S>;
    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner,
            counts: self.0.clone(),
        }
    }
}

/// The service of [`CountLayer`].
#[derive(Debug, Clone)]
pub struct Counted<S> {
    inner: S,
    counts: Arc<RequestCounts>,
}

impl<S, Req, Res> tower::Service<http::Request<Req>> for Counted<S>
where
    S: tower::Service<http::Request<Req>, Response = http::Response<Res>>,
    S::Future: Send + 'static,
    S::Error: 'static,
    Res: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Req>) -> Self::Future {
        let method = request.method().to_string();
        let counts = self.counts.clone();
        let response = self.inner.call(request);
        Box::pin(async move {
            let r = response.await;
            let code = match &r {
                Ok(response) => response.status().as_u16().to_string(),
                Err(_) => "<error>".to_string(),
            };
            counts.record(&method, &code);
            r
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Layer, Service, ServiceExt};

    #[tokio::test]
    async fn each_request_is_counted_by_method_and_code() {
        let counts = Arc::new(RequestCounts::default());
        let mut svc = CountLayer(counts.clone()).layer(tower::service_fn(
            |r: http::Request<()>| async move {
                match r.uri().path() {
                    "/fail" => Err("refused"),
                    "/missing" => Ok(http::Response::builder().status(404).body(()).unwrap()),
                    _ => Ok(http::Response::new(())),
                }
            },
        ));
        for (method, path) in [
            ("GET", "/a"),
            ("GET", "/b"),
            ("GET", "/missing"),
            ("POST", "/fail"),
        ] {
            let r = http::Request::builder()
                .method(method)
                .uri(path)
                .body(())
                .unwrap();
            let _ = svc.ready().await.unwrap().call(r).await;
        }
        assert_eq!(
            counts.snapshot(),
            [
                ("GET".into(), "200".into(), 2),
                ("GET".into(), "404".into(), 1),
                ("POST".into(), "<error>".into(), 1)
            ]
        );
    }
}
