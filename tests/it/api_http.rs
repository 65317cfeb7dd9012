//! One GET against the usage API with a real HTTP client (reqwest), for the
//! API's tests: the status, the headers and the body.

use std::time::Duration;

pub(crate) struct Reply {
    pub status: u16,
    headers: reqwest::header::HeaderMap,
    pub body: String,
}

impl Reply {
    /// A header's value, or "" without it.
    pub fn header(&self, name: &str) -> String {
        self.headers
            .get(name)
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default()
    }
}

/// `GET http://addr/path` with `Authorization: <authorization>` (if any) and
/// `Accept: <accept>`, within 30 s.
pub(crate) fn api_request(
    addr: &str,
    path: &str,
    authorization: Option<&str>,
    accept: &str,
) -> Reply {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut req = reqwest::Client::new()
            .get(format!("http://{addr}{path}"))
            .header("accept", accept)
            .timeout(Duration::from_secs(30));
        if let Some(a) = authorization {
            req = req.header("authorization", a);
        }
        let r = req.send().await.unwrap();
        Reply {
            status: r.status().as_u16(),
            headers: r.headers().clone(),
            body: r.text().await.unwrap(),
        }
    })
}
