//! A plain HTTP client for talking to the simulator as any Kubernetes client would.
#![allow(dead_code)]

use std::time::Duration;

use bytes::Bytes;
use fleetscope_sim::{Cluster, ClusterConfig, SimServer};
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// Generous bound for anything a test waits on.
pub const PATIENCE: Duration = Duration::from_secs(30);

pub struct Api {
    pub base: String,
    pub token: Option<String>,
    client: Client<HttpConnector, Full<Bytes>>,
}

#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }
}

impl Api {
    pub fn new(server: &SimServer) -> Self {
        Self {
            base: server.url(),
            token: Some(server.cluster().admin_token()),
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    pub fn with_token(&self, token: Option<&str>) -> Self {
        Self {
            base: self.base.clone(),
            token: token.map(str::to_string),
            client: self.client.clone(),
        }
    }

    fn request(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Value>,
    ) -> Request<Full<Bytes>> {
        let mut b = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        let body = body
            .map(|v| Bytes::from(serde_json::to_vec(&v).unwrap()))
            .unwrap_or_default();
        b.body(Full::new(body)).unwrap()
    }

    pub async fn send(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Value>,
    ) -> Reply {
        let req = self.request(method, path, headers, body);
        let resp = tokio::time::timeout(PATIENCE, self.client.request(req))
            .await
            .expect("request timed out")
            .expect("request failed");
        let status = resp.status();
        let headers = resp.headers().clone();
        let body = tokio::time::timeout(PATIENCE, resp.into_body().collect())
            .await
            .expect("body timed out")
            .expect("body failed")
            .to_bytes();
        Reply {
            status,
            headers,
            body,
        }
    }

    /// A request whose failure to get any answer is a result, not a panic.
    pub async fn try_get(&self, path: &str) -> Result<StatusCode, String> {
        let req = self.request(Method::GET, path, &[], None);
        match tokio::time::timeout(PATIENCE, self.client.request(req))
            .await
            .expect("request timed out")
        {
            Ok(resp) => Ok(resp.status()),
            Err(e) => Err(e.to_string()),
        }
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.send(Method::GET, path, &[], None).await
    }

    /// Opens a watch and returns a reader of its events, one JSON value per event.
    pub async fn watch(&self, path: &str) -> Result<Events, Reply> {
        let req = self.request(Method::GET, path, &[], None);
        let resp = tokio::time::timeout(PATIENCE, self.client.request(req))
            .await
            .expect("watch timed out")
            .expect("watch failed");
        if resp.status() != StatusCode::OK {
            let status = resp.status();
            let headers = resp.headers().clone();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            return Err(Reply {
                status,
                headers,
                body,
            });
        }
        Ok(Events {
            body: resp.into_body(),
            buf: Vec::new(),
        })
    }
}

pub struct Events {
    body: hyper::body::Incoming,
    buf: Vec<u8>,
}

/// How a watch stream ended, or its next event.
#[derive(Debug)]
pub enum Next {
    Event(Value),
    End,
    Broken,
}

impl Events {
    /// The next event, waiting at most `PATIENCE`.
    pub async fn next(&mut self) -> Next {
        loop {
            if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                return Next::Event(serde_json::from_slice(&line).expect("event is JSON"));
            }
            match tokio::time::timeout(PATIENCE, self.body.frame())
                .await
                .expect("no event within the patience bound")
            {
                None => return Next::End,
                Some(Err(_)) => return Next::Broken,
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }

    pub async fn event(&mut self) -> Value {
        match self.next().await {
            Next::Event(v) => v,
            other => panic!("expected an event, got {other:?}"),
        }
    }

    /// Events until the stream ends; panics if it breaks.
    pub async fn rest(&mut self) -> Vec<Value> {
        let mut out = Vec::new();
        loop {
            match self.next().await {
                Next::Event(v) => out.push(v),
                Next::End => return out,
                Next::Broken => panic!("stream broke after {out:?}"),
            }
        }
    }
}

/// A cluster over plain HTTP, for the raw client here; HTTPS is covered by the kube-rs and kubectl tests.
pub async fn start(mut config: ClusterConfig) -> SimServer {
    config.tls = false;
    SimServer::start_local(Cluster::new(config))
        .await
        .expect("simulator starts")
}

pub fn fixture(name: &str) -> Value {
    let path = format!(
        "{}/tests/fixtures/kube-apiserver-v1.20/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

pub fn fixture_lines(name: &str) -> Vec<Value> {
    let path = format!(
        "{}/tests/fixtures/kube-apiserver-v1.20/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}
