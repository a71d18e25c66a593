//! Just enough of WebDriver (W3C) to drive the console in headless Chromium: a session,
//! navigation, finding elements, typing, clicking, reading text, running a script and taking
//! a screenshot. Spoken over plain HTTP/1.1 to a chromedriver this harness starts itself.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// A chromedriver process, killed when dropped.
pub struct Driver {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Driver {
    /// Starts `chromedriver` on a port the kernel picked for a moment before.
    pub fn start(chromedriver: &Path) -> Result<Self, String> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| format!("no free port: {e}"))?
            .port();
        let child = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", chromedriver.display()))?;
        let driver = Self { child, addr: SocketAddr::from(([127, 0, 0, 1], port)) };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if driver.call("GET", "/status", None).is_ok_and(|v| v["value"]["ready"] == true) {
                return Ok(driver);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err("chromedriver did not become ready within 20 s".to_owned())
    }

    /// One call of the protocol; its JSON answer, or the error it names.
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, String> {
        let body = body.map(Value::to_string).unwrap_or_default();
        let mut stream = TcpStream::connect(self.addr).map_err(|e| e.to_string())?;
        stream.set_read_timeout(Some(Duration::from_secs(60))).map_err(|e| e.to_string())?;
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            self.addr,
            body.len()
        );
        stream.write_all(request.as_bytes()).map_err(|e| e.to_string())?;
        // chromedriver says `Connection: close` and keeps the connection open: the answer is
        // read to its Content-Length, not to the end of the stream.
        let mut raw = Vec::new();
        let mut chunk = [0u8; 8192];
        let (head_end, length) = loop {
            let n = stream.read(&mut chunk).map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("chromedriver closed without an answer".to_owned());
            }
            raw.extend_from_slice(&chunk[..n]);
            if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
                let length = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .ok_or_else(|| format!("an answer without a content-length: {head}"))?;
                break (end + 4, length);
            }
        };
        while raw.len() < head_end + length {
            let n = stream.read(&mut chunk).map_err(|e| e.to_string())?;
            if n == 0 {
                return Err("chromedriver closed mid-answer".to_owned());
            }
            raw.extend_from_slice(&chunk[..n]);
        }
        let payload = String::from_utf8_lossy(&raw[head_end..head_end + length]).into_owned();
        let payload = payload.as_str();
        let value: Value = serde_json::from_str(payload).map_err(|e| format!("{e}: {payload}"))?;
        if let Some(error) = value["value"]["error"].as_str() {
            return Err(format!("{error}: {}", value["value"]["message"].as_str().unwrap_or_default()));
        }
        Ok(value)
    }

    /// A new headless browser.
    pub fn session(&self, chromium: &Path) -> Result<Session<'_>, String> {
        let capabilities = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium.display().to_string(),
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         "--window-size=1400,1800", "--no-first-run", "--disable-extensions"],
            },
        }}});
        let answer = self.call("POST", "/session", Some(&capabilities))?;
        let id = answer["value"]["sessionId"].as_str().ok_or("no session id")?.to_owned();
        Ok(Session { driver: self, id })
    }
}

/// One browser, closed when dropped.
pub struct Session<'a> {
    driver: &'a Driver,
    id: String,
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        let _ = self.driver.call("DELETE", &format!("/session/{}", self.id), None);
    }
}

/// An element of the page.
#[derive(Clone)]
pub struct Element(String);

impl Session<'_> {
    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let answer = self.driver.call(method, &format!("/session/{}{path}", self.id), body.as_ref())?;
        Ok(answer["value"].clone())
    }

    pub fn go(&self, url: &str) -> Result<(), String> {
        self.call("POST", "/url", Some(json!({ "url": url }))).map(drop)
    }

    /// The elements `css` selects now.
    pub fn all(&self, css: &str) -> Result<Vec<Element>, String> {
        let found = self.call("POST", "/elements", Some(json!({ "using": "css selector", "value": css })))?;
        Ok(found
            .as_array()
            // Each element is an object of one entry: the protocol's element key and its id.
            .map(|items| {
                items
                    .iter()
                    .filter_map(|e| e.as_object()?.values().next()?.as_str().map(|id| Element(id.to_owned())))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// The first element `css` selects, waiting up to `limit` for it.
    pub fn find(&self, css: &str, limit: Duration) -> Result<Element, String> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(first) = self.all(css)?.into_iter().next() {
                return Ok(first);
            }
            if Instant::now() > deadline {
                return Err(format!("nothing matches {css:?} within {limit:?}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits up to `limit` until `holds` says yes of the page's text under `css`.
    pub fn wait_text(&self, css: &str, limit: Duration, holds: impl Fn(&str) -> bool) -> Result<String, String> {
        let deadline = Instant::now() + limit;
        loop {
            let text = match self.all(css)?.into_iter().next() {
                Some(e) => self.text(&e)?,
                None => String::new(),
            };
            if holds(&text) {
                return Ok(text);
            }
            if Instant::now() > deadline {
                return Err(format!("the text of {css:?} never held within {limit:?}; last: {text:?}"));
            }
            std::thread::sleep(Duration::from_millis(150));
        }
    }

    pub fn text(&self, e: &Element) -> Result<String, String> {
        Ok(self.call("GET", &format!("/element/{}/text", e.0), None)?.as_str().unwrap_or_default().to_owned())
    }

    pub fn displayed(&self, e: &Element) -> Result<bool, String> {
        Ok(self.call("GET", &format!("/element/{}/displayed", e.0), None)?.as_bool().unwrap_or(false))
    }

    pub fn click(&self, e: &Element) -> Result<(), String> {
        self.call("POST", &format!("/element/{}/click", e.0), Some(json!({}))).map(drop)
    }

    pub fn clear(&self, e: &Element) -> Result<(), String> {
        self.call("POST", &format!("/element/{}/clear", e.0), Some(json!({}))).map(drop)
    }

    pub fn type_text(&self, e: &Element, text: &str) -> Result<(), String> {
        self.call("POST", &format!("/element/{}/value", e.0), Some(json!({ "text": text }))).map(drop)
    }

    /// Runs `script` in the page; its return value.
    pub fn run(&self, script: &str) -> Result<Value, String> {
        self.call("POST", "/execute/sync", Some(json!({ "script": script, "args": [] })))
    }

    /// The page's markup now (for a failure's message).
    pub fn source(&self) -> String {
        self.call("GET", "/source", None).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
    }

    /// The page as a PNG.
    pub fn screenshot(&self) -> Result<Vec<u8>, String> {
        let encoded = self.call("GET", "/screenshot", None)?;
        let text = encoded.as_str().ok_or("no screenshot")?;
        decode_base64(text).ok_or_else(|| "the screenshot is not base64".to_owned())
    }
}

fn decode_base64(text: &str) -> Option<Vec<u8>> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    };
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let mut buffer = 0u32;
    let mut bits = 0;
    for c in text.bytes().filter(|c| !c.is_ascii_whitespace() && *c != b'=') {
        buffer = (buffer << 6) | u32::from(value(c)?);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buffer >> bits) as u8);
        }
    }
    Some(out)
}
