//! A loopback HTTP/1.1 server for the provider tests: one request per
//! connection on 127.0.0.1, answered with scripted replies in order; every
//! request's path and JSON body are reported.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use serde_json::Value;

/// What the server answers to one request.
pub enum Reply {
    /// A JSON body with a status and extra headers.
    Json {
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: String,
    },
    /// A `text/event-stream` body: these frames, written one by one, then
    /// the connection closes.
    Events(Vec<String>),
    /// An event stream whose connection is reset after these frames.
    #[cfg_attr(not(feature = "openai"), allow(dead_code))]
    Reset(Vec<String>),
    /// Never answers.
    #[cfg_attr(not(feature = "openai"), allow(dead_code))]
    Hang,
}

impl Reply {
    /// A JSON body with a status.
    pub fn json(status: u16, body: impl Into<String>) -> Reply {
        Reply::Json {
            status,
            headers: Vec::new(),
            body: body.into(),
        }
    }
}

/// A request as the server saw it.
pub struct Seen {
    pub head: String,
    pub body: Value,
}

/// Starts the server; returns its base URL (`http://127.0.0.1:PORT`) and
/// the requests it receives.
pub async fn server(replies: Vec<Reply>) -> (String, mpsc::UnboundedReceiver<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let address = listener.local_addr().expect("address");
    let (seen, received) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        for reply in replies {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let (head, body) = read_request(&mut stream).await;
            let _ = seen.send(Seen {
                head,
                body: serde_json::from_slice(&body).unwrap_or(Value::Null),
            });
            respond(stream, reply).await;
        }
    });
    (format!("http://{address}"), received)
}

async fn read_request(stream: &mut TcpStream) -> (String, Vec<u8>) {
    let mut data = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let n = stream.read(&mut buffer).await.expect("reads");
        assert!(n > 0, "the client closed before a whole request");
        data.extend_from_slice(&buffer[..n]);
        if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&data[..end]).to_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map(|v| v.trim().parse().expect("a length"))
                .unwrap_or(0);
            while data.len() < end + 4 + length {
                let n = stream.read(&mut buffer).await.expect("reads");
                data.extend_from_slice(&buffer[..n]);
            }
            return (head, data[end + 4..end + 4 + length].to_vec());
        }
    }
}

async fn respond(mut stream: TcpStream, reply: Reply) {
    match reply {
        Reply::Json {
            status,
            headers,
            body,
        } => {
            let mut head = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
                body.len()
            );
            for (name, value) in headers {
                head.push_str(&format!("{name}: {value}\r\n"));
            }
            head.push_str("\r\n");
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(body.as_bytes()).await;
        }
        Reply::Events(frames) => {
            write_events(&mut stream, frames).await;
        }
        Reply::Reset(frames) => {
            // A chunked body that stops mid-way: the client sees the
            // connection lost in the middle of the answer.
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
                .await;
            for frame in frames {
                let chunk = format!("{:x}\r\n{frame}\r\n", frame.len());
                let _ = stream.write_all(chunk.as_bytes()).await;
                let _ = stream.flush().await;
            }
            let _ = stream.write_all(b"ff\r\npartial").await;
            let _ = stream.flush().await;
            drop(stream);
            return;
        }
        Reply::Hang => std::future::pending::<()>().await,
    }
    let _ = stream.shutdown().await;
}

async fn write_events(stream: &mut TcpStream, frames: Vec<String>) {
    let _ = stream
        .write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n",
        )
        .await;
    for frame in frames {
        let _ = stream.write_all(frame.as_bytes()).await;
        let _ = stream.flush().await;
    }
}

/// An SSE frame carrying `data` (one `data:` line per line of it).
#[cfg_attr(not(feature = "openai"), allow(dead_code))]
pub fn data(data: &str) -> String {
    let mut frame: String = data.lines().map(|line| format!("data: {line}\n")).collect();
    frame.push('\n');
    frame
}

/// An SSE frame with an event name.
#[cfg_attr(not(feature = "anthropic"), allow(dead_code))]
pub fn event(name: &str, data: &Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}
