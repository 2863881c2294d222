//! The collector endpoint of a `TracingConfiguration` file: a gRPC target, validated as
//! kube-apiserver validates it (Go's `net/url` on the value, `dns://` put in front when it
//! holds no `//`; schemes `dns`, `unix` and `unix-abstract`) and then resolved as grpc-go
//! resolves it, so that a value kube-apiserver takes is taken here and means the same collector.

use std::path::PathBuf;

/// Where a collector listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Collector {
    Tcp {
        host: String,
        port: u16,
    },
    /// A unix domain socket.
    Unix(PathBuf),
    /// A socket in Linux's abstract namespace, by its name (without the leading NUL).
    UnixAbstract(String),
}

/// The parts of a URL as Go's `url.Parse` splits them; only what the validation reads.
#[derive(Debug, PartialEq, Eq)]
struct GoUrl<'a> {
    /// Lower-cased.
    scheme: String,
    opaque: &'a str,
    host: &'a str,
    path: &'a str,
}

/// kube-apiserver's `validateEndpoint`: `Err` with its reason where it refuses the value.
pub fn kube_validates(value: &str) -> Result<(), String> {
    let prefixed;
    let value = if value.contains("//") {
        value
    } else {
        prefixed = format!("dns://{value}");
        &prefixed
    };
    let url = go_parse(value)?;
    match url.scheme.as_str() {
        "dns" | "unix" | "unix-abstract" => Ok(()),
        other => Err(format!(
            "unsupported scheme {other:?}: use host:port, dns:///host:port, unix:///path or unix-abstract:name"
        )),
    }
}

/// The collector grpc-go dials for a target kube-apiserver accepted. grpc-go takes a scheme it
/// has a resolver for, and reads anything else as `dns:///` followed by the whole value.
pub fn grpc_target(value: &str) -> Result<Collector, String> {
    let parsed = go_parse(value).ok();
    let Some(url) = parsed.filter(|url| {
        matches!(
            url.scheme.as_str(),
            "dns" | "passthrough" | "unix" | "unix-abstract"
        )
    }) else {
        return dns_address(value);
    };
    // grpc-go's `Target.Endpoint`: the path, or the opaque part, without a leading slash.
    let raw = if url.path.is_empty() {
        url.opaque
    } else {
        url.path
    };
    match url.scheme.as_str() {
        "unix" | "unix-abstract" if !url.host.is_empty() => Err(format!(
            "{}://{}… names a host; a socket is {}:///path",
            url.scheme, url.host, url.scheme
        )),
        "unix" if raw.is_empty() => Err("no socket path".to_string()),
        "unix" => Ok(Collector::Unix(PathBuf::from(raw))),
        "unix-abstract" if cfg!(target_os = "linux") => {
            Ok(Collector::UnixAbstract(raw.to_string()))
        }
        "unix-abstract" => Err("abstract unix sockets exist only on Linux".to_string()),
        // dns://SERVER/host:port asks a DNS server of its own; the system's resolver is used,
        // but a value with nothing after the server names no collector at all.
        _ if raw.trim_start_matches('/').is_empty() && !url.host.is_empty() => Err(format!(
            "dns://{}… names a DNS server, not the collector: use dns:///host:port or host:port",
            url.host
        )),
        _ => dns_address(raw.trim_start_matches('/')),
    }
}

/// grpc-go's DNS resolver reading `host[:port]`: the port 443 when none is given, `localhost`
/// for an empty host, an IPv6 address bare or in brackets.
fn dns_address(target: &str) -> Result<Collector, String> {
    const DEFAULT_PORT: u16 = 443;
    if target.is_empty() {
        return Err("no address".to_string());
    }
    let tcp = |host: &str, port: u16| Collector::Tcp {
        host: if host.is_empty() { "localhost" } else { host }.to_string(),
        port,
    };
    if target.parse::<std::net::IpAddr>().is_ok() {
        return Ok(tcp(target, DEFAULT_PORT));
    }
    let (host, port) = match split_host_port(target) {
        Some((host, port)) => (host, Some(port)),
        None => (target, None),
    };
    if host.contains(':') && !host.starts_with('[') && port.is_none() {
        return Err(format!("{target:?} is not host:port"));
    }
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match port {
        None => Ok(tcp(host, DEFAULT_PORT)),
        Some("") => Err("nothing after the port's colon".to_string()),
        Some(port) => port
            .parse::<u16>()
            .map(|port| tcp(host, port))
            .map_err(|_| format!("port {port:?} is not a number from 0 to 65535")),
    }
}

/// Go's `net.SplitHostPort`, loosely: `host:port` or `[v6]:port`; `None` when there is no port.
fn split_host_port(value: &str) -> Option<(&str, &str)> {
    if value.starts_with('[') {
        let end = value.find(']')?;
        return value[end + 1..]
            .strip_prefix(':')
            .map(|port| (&value[..=end], port));
    }
    let (host, port) = value.rsplit_once(':')?;
    (!host.contains(':')).then_some((host, port))
}

/// Go's `url.Parse`, as far as it decides whether a value parses and what its scheme, opaque
/// part, host and path are.
fn go_parse(value: &str) -> Result<GoUrl<'_>, String> {
    if value.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return Err("a control character".to_string());
    }
    let value = value.split_once('#').map_or(value, |(before, _)| before);
    let (scheme, rest) = scheme(value)?;
    let rest = rest.split_once('?').map_or(rest, |(before, _)| before);
    let mut url = GoUrl {
        scheme: scheme.to_ascii_lowercase(),
        opaque: "",
        host: "",
        path: "",
    };
    if !rest.starts_with('/') {
        if !scheme.is_empty() {
            url.opaque = rest;
            return Ok(url);
        }
        if rest
            .split('/')
            .next()
            .is_some_and(|first| first.contains(':'))
        {
            return Err("first path segment in URL cannot contain colon".to_string());
        }
    }
    let mut rest = rest;
    if rest.starts_with("//") && (!scheme.is_empty() || !rest.starts_with("///")) {
        let authority_end = rest[2..].find('/').map_or(rest.len(), |at| at + 2);
        let authority = &rest[2..authority_end];
        let host = authority
            .rsplit_once('@')
            .map_or(authority, |(_, host)| host);
        valid_host(host)?;
        url.host = host;
        rest = &rest[authority_end..];
    }
    unescapes(rest)?;
    url.path = rest;
    Ok(url)
}

/// Go's `getScheme`: the scheme and what follows its colon, or no scheme.
fn scheme(value: &str) -> Result<(&str, &str), String> {
    for (i, c) in value.char_indices() {
        match c {
            'a'..='z' | 'A'..='Z' => {}
            '0'..='9' | '+' | '-' | '.' if i > 0 => {}
            ':' if i == 0 => return Err("missing protocol scheme".to_string()),
            ':' => return Ok((&value[..i], &value[i + 1..])),
            _ => return Ok(("", value)),
        }
    }
    Ok(("", value))
}

/// Go's `parseHost`: a port, where there is one, is digits; percent escapes are whole.
fn valid_host(host: &str) -> Result<(), String> {
    let port = if host.starts_with('[') {
        let end = host
            .rfind(']')
            .ok_or_else(|| "missing ']' in host".to_string())?;
        let after = &host[end + 1..];
        if !after.is_empty() && !after.starts_with(':') {
            return Err(format!("invalid port {after:?} after host"));
        }
        after
    } else {
        host.rfind(':').map_or("", |at| &host[at..])
    };
    if !port.is_empty() && !port[1..].bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("invalid port {port:?} after host"));
    }
    unescapes(host)
}

fn unescapes(text: &str) -> Result<(), String> {
    let bytes = text.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'%'
            && !bytes
                .get(i + 1..i + 3)
                .is_some_and(|hex| hex.iter().all(u8::is_ascii_hexdigit))
        {
            return Err(format!(
                "invalid URL escape {:?}",
                &text[i..(i + 3).min(text.len())]
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kube-apiserver's own table (component-base's `TestValidateTracingConfiguration`) and
    /// the forms of gRPC's naming document, with what each is taken to be.
    #[test]
    fn the_endpoint_grammar_is_kube_apiservers() {
        let tcp = |host: &str, port| {
            Ok(Collector::Tcp {
                host: host.to_string(),
                port,
            })
        };
        // Taken by kube-apiserver, and dialled as grpc-go dials them.
        for (value, collector) in [
            ("localhost:4317", tcp("localhost", 4317)),
            (
                "collector.monitoring.svc:4317",
                tcp("collector.monitoring.svc", 4317),
            ),
            ("10.0.0.7:4317", tcp("10.0.0.7", 4317)),
            ("[::1]:4317", tcp("::1", 4317)),
            ("collector", tcp("collector", 443)),
            (":4317", tcp("localhost", 4317)),
            ("dns:///collector:4317", tcp("collector", 4317)),
            ("dns://10.0.0.10/collector:4317", tcp("collector", 4317)),
            (
                "unix:///run/otel/otlp.sock",
                Ok(Collector::Unix("/run/otel/otlp.sock".into())),
            ),
            (
                "unix:/run/otel/otlp.sock",
                Ok(Collector::Unix("/run/otel/otlp.sock".into())),
            ),
        ] {
            assert_eq!(kube_validates(value), Ok(()), "{value}");
            assert_eq!(grpc_target(value), collector, "{value}");
        }
        #[cfg(target_os = "linux")]
        assert_eq!(
            grpc_target("unix-abstract:///otlp"),
            Ok(Collector::UnixAbstract("/otlp".to_string()))
        );
        // Taken by kube-apiserver, and by grpc-go too, which then never connects: refused here
        // with the reason instead of exporting nothing.
        for value in [
            "dns://google.com:4317",
            "unix://path/to/socket",
            "collector:",
        ] {
            assert_eq!(kube_validates(value), Ok(()), "{value}");
            assert!(grpc_target(value).is_err(), "{value}");
        }
        // Refused by kube-apiserver.
        for value in [
            "http://localhost:4317",
            "https://collector:4317",
            "dn%2s://localhost:4317",
            "unix:relative.sock",
            "collector:otlp",
            "//collector:4317",
            "localhost:4317\n",
        ] {
            assert!(kube_validates(value).is_err(), "{value}");
        }
    }
}
