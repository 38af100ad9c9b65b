//! An SGLang worker's HTTP surface as the updater reads it, in process: `/metrics` in SGLang
//! 0.5.23's names and label sets (`sglang:page_size`, the load gauges with a `priority=""`
//! total plus one sample per priority, every TP rank exported), `/server_info` with
//! `kv_events.block_size` (page size x DCP size), and `/tokenize` either answered by a
//! simulated worker (the demo model's template and tokenizer) or refused with the 400 SGLang
//! sends when its chat template is not Jinja. `/v1/models` is the simulated worker's.

use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;

/// What the face announces.
#[derive(Debug, Clone)]
pub struct SglangFace {
    pub page_size: u32,
    pub dcp_size: u32,
    /// Answer `/tokenize` with SGLang's 400 for a non-Jinja chat template.
    pub builtin_template: bool,
    /// Running requests in total (the `priority=""` sample); the per-priority samples split it.
    pub running: u32,
    pub waiting: u32,
    /// Every TP rank's `sglang:token_usage` (the same batch).
    pub token_usage: f64,
}

/// SGLang's answer to `/tokenize` with `add_generation_prompt` under a built-in template.
pub const NOT_JINJA: &str = r#"{"object":"error","message":"add_generation_prompt is supported only with a Jinja chat template.","type":"BadRequestError","param":null,"code":400}"#;

impl SglangFace {
    /// `/metrics` as SGLang 0.5.23 writes it with priority scheduling and
    /// `--enable-metrics-for-all-schedulers` at TP 2.
    pub fn metrics(&self) -> String {
        let mut out = String::from(
            "# HELP sglang:page_size KV cache page size in tokens.\n# TYPE sglang:page_size gauge\n",
        );
        for tp in 0..2 {
            let base = format!(
                "engine_type=\"unified\",model_name=\"kvroute-demo\",moe_ep_rank=\"0\",pp_rank=\"0\",tp_rank=\"{tp}\""
            );
            out += &format!("sglang:page_size{{{base},priority=\"\"}} {}.0\n", self.page_size);
            for (name, total) in
                [("sglang:num_running_reqs", self.running), ("sglang:num_queue_reqs", self.waiting)]
            {
                out += &format!("{name}{{{base},priority=\"\"}} {total}.0\n");
                let high = total / 2;
                out += &format!("{name}{{{base},priority=\"10\"}} {high}.0\n");
                out += &format!("{name}{{{base},priority=\"0\"}} {}.0\n", total - high);
            }
            out += &format!("sglang:token_usage{{{base},priority=\"\"}} {}\n", self.token_usage);
        }
        out
    }

    /// Serves the face on a free loopback port, answering `/v1/models` and `/tokenize` from
    /// the simulated worker at `sim` (`ip:port`); returns its `ip:port`. The server runs until
    /// the test's runtime ends.
    pub async fn serve(self, sim: String) -> anyhow::Result<String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let face = std::sync::Arc::new(self);
        let (m, i, t) = (face.clone(), face.clone(), face);
        let (sim_models, sim_tok) = (sim.clone(), sim);
        let app = axum::Router::new()
            .route("/metrics", get(move || async move { m.metrics() }))
            .route(
                "/server_info",
                get(move || async move {
                    axum::Json(json!({
                        "page_size": i.page_size,
                        "dcp_size": i.dcp_size,
                        "kv_events": {
                            "publisher": "zmq", "endpoint_host": "*", "endpoint_port_base": 5557,
                            "topic": "", "block_size": i.page_size * i.dcp_size, "dp_size": 1,
                        },
                    }))
                }),
            )
            .route(
                "/v1/models",
                get(move || async move { forward(&sim_models, "/v1/models", None).await }),
            )
            .route(
                "/tokenize",
                post(move |body: Bytes| async move {
                    if t.builtin_template {
                        return (
                            StatusCode::BAD_REQUEST,
                            [("content-type", "application/json")],
                            NOT_JINJA,
                        )
                            .into_response();
                    }
                    forward(&sim_tok, "/tokenize", Some(body)).await
                }),
            );
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(addr)
    }
}

async fn forward(sim: &str, path: &str, body: Option<Bytes>) -> Response {
    let http = reqwest::Client::new();
    let url = format!("http://{sim}{path}");
    let req = match body {
        Some(b) => http.post(url).header("content-type", "application/json").body(b),
        None => http.get(url),
    };
    match req.send().await {
        Ok(r) => {
            let status =
                StatusCode::from_u16(r.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
            let bytes = r.bytes().await.unwrap_or_default();
            (status, [("content-type", "application/json")], bytes).into_response()
        }
        Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    }
}
