//! Reading a worker's HTTP answers (`/metrics`, `/tokenize`, `/v1/models`) within a size cap,
//! so that a worker cannot make the updater buffer an unbounded body.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum BodyError {
    #[error("answer larger than {0} bytes")]
    TooLarge(usize),
    #[error("http: {0}")]
    Http(#[from] reqwest::Error),
    #[error("answer is not UTF-8")]
    Utf8,
    #[error("answer is not JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// The body of `resp`, refused as soon as it is known to exceed `max` bytes.
pub async fn bytes(mut resp: reqwest::Response, max: usize) -> Result<Vec<u8>, BodyError> {
    if resp.content_length().is_some_and(|n| n > max as u64) {
        return Err(BodyError::TooLarge(max));
    }
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        if out.len() + chunk.len() > max {
            return Err(BodyError::TooLarge(max));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

pub async fn text(resp: reqwest::Response, max: usize) -> Result<String, BodyError> {
    String::from_utf8(bytes(resp, max).await?).map_err(|_| BodyError::Utf8)
}

pub async fn json(resp: reqwest::Response, max: usize) -> Result<serde_json::Value, BodyError> {
    Ok(serde_json::from_slice(&bytes(resp, max).await?)?)
}
