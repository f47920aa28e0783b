use super::*;

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

#[test]
fn off_by_default_as_in_go() {
    assert_eq!(ServerTls::from_env(&env(&[])), Ok(None));
    assert_eq!(ServerTls::from_env(&env(&[("GRPC_SERVER_USE_TLS", "")])), Ok(None));
    assert_eq!(ServerTls::from_env(&env(&[("GRPC_SERVER_USE_TLS", "false")])), Ok(None));
    // The paths alone do not turn it on.
    let paths = [("GRPC_SERVER_TLS_CERT", "/c"), ("GRPC_SERVER_TLS_KEY", "/k")];
    assert_eq!(ServerTls::from_env(&env(&paths)), Ok(None));
}

#[test]
fn reads_the_go_names() {
    let e = env(&[
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
        ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
        ("GRPC_CLIENT_TLS_CACERT", "/certs/ca.crt"),
        ("GRPC_CLIENT_TLS_SAN", "envoy.example"),
    ]);
    let tls = ServerTls::from_env(&e).unwrap().unwrap();
    assert_eq!(tls.cert, Path::new("/certs/tls.crt"));
    assert_eq!(tls.key, Path::new("/certs/tls.key"));
    assert_eq!(tls.client_ca.as_deref(), Some(Path::new("/certs/ca.crt")));
    assert_eq!(tls.client_san.as_deref(), Some("envoy.example"));
    assert_eq!(tls.handshake_timeout, HANDSHAKE_TIMEOUT);
    assert_eq!(tls.reload_interval, RELOAD_INTERVAL);
}

#[test]
fn envoy_gateways_ca_name_is_read_after_the_go_services() {
    // Envoy Gateway's deployment: its name for the client CA (which Go ignores) is read.
    let mut pairs = vec![
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
        ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
        ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
    ];
    let ca = |pairs: &[(&str, &str)]| ServerTls::from_env(&env(pairs)).unwrap().unwrap().client_ca;
    assert_eq!(ca(&pairs).as_deref(), Some(Path::new("/certs/ca.crt")));
    pairs.push(("GRPC_CLIENT_TLS_CACERT", "/go/ca.crt"));
    assert_eq!(ca(&pairs).as_deref(), Some(Path::new("/go/ca.crt")), "Go's name first");
}

#[test]
fn clear_errors() {
    let err = ServerTls::from_env(&env(&[("GRPC_SERVER_USE_TLS", "yes")])).unwrap_err();
    assert!(err.contains("GRPC_SERVER_USE_TLS=yes"), "{err}");
    let err = ServerTls::from_env(&env(&[("GRPC_SERVER_USE_TLS", "1")])).unwrap_err();
    assert!(err.contains("GRPC_SERVER_TLS_CERT"), "{err}");
    let err =
        ServerTls::from_env(&env(&[("GRPC_SERVER_USE_TLS", "T"), ("GRPC_SERVER_TLS_CERT", "/c")]))
            .unwrap_err();
    assert!(err.contains("GRPC_SERVER_TLS_KEY"), "{err}");
    let err = ServerTls::from_env(&env(&[
        ("GRPC_SERVER_USE_TLS", "true"),
        ("GRPC_SERVER_TLS_CERT", "/c"),
        ("GRPC_SERVER_TLS_KEY", "/k"),
        ("GRPC_CLIENT_TLS_SAN", "not a name"),
    ]))
    .unwrap_err();
    assert!(err.contains("GRPC_CLIENT_TLS_SAN"), "{err}");
}

fn pem_encode(label: &str, der: &[u8]) -> String {
    const B64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut text = String::new();
    for chunk in der.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                text.push(char::from(B64[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                text.push('=');
            }
        }
    }
    let lines: Vec<&str> =
        text.as_bytes().chunks(64).map(|l| std::str::from_utf8(l).unwrap()).collect();
    format!("-----BEGIN {label}-----\n{}\n-----END {label}-----\n", lines.join("\n"))
}

#[test]
fn file_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("tls.crt");
    let key = dir.path().join("tls.key");
    let settings = ServerTls::new(&cert, &key);

    let err = settings.load().unwrap_err();
    assert!(matches!(err, TlsError::Read { .. }), "{err}");
    assert!(err.to_string().contains("tls.crt"), "{err}");

    std::fs::write(&cert, "").unwrap();
    std::fs::write(&key, "").unwrap();
    let err = settings.load().unwrap_err();
    assert!(matches!(err, TlsError::Empty { what: "certificate", .. }), "{err}");

    std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\nnot base64!\n").unwrap();
    let err = settings.load().unwrap_err();
    assert!(matches!(err, TlsError::Malformed { .. }), "{err}");
    assert!(err.to_string().contains("tls.crt"), "{err}");

    let one = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let two = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    std::fs::write(&cert, one.cert.pem()).unwrap();
    let err = settings.load().unwrap_err();
    assert!(matches!(err, TlsError::Empty { what: "private key", .. }), "{err}");
    assert!(err.to_string().contains("tls.key"), "{err}");

    std::fs::write(&key, two.signing_key.serialize_pem()).unwrap();
    let err = settings.load().unwrap_err();
    assert!(matches!(err, TlsError::KeyMismatch { .. }), "{err}");

    std::fs::write(&key, one.signing_key.serialize_pem()).unwrap();
    let tls = settings.load().unwrap();
    assert!(matches!(tls.reload(), Ok(false)));

    // The same P-256 key as SEC1 (`EC PRIVATE KEY`): ring's PKCS#8 wraps it at a fixed
    // offset (version, algorithm, then an OCTET STRING of 0x6d bytes).
    let pkcs8 = one.signing_key.serialize_der();
    assert_eq!(pkcs8[27..29], [0x04, 0x6d], "the PKCS#8 layout assumed: {:02x?}", &pkcs8[..29]);
    let sec1 = PrivateKeyDer::Sec1(pkcs8[29..].to_vec().into());
    let sec1_pem = pem_encode("EC PRIVATE KEY", sec1.secret_der());
    std::fs::write(&key, sec1_pem).unwrap();
    std::fs::write(&cert, one.cert.pem()).unwrap();
    assert!(settings.load().is_ok());
    std::fs::write(&key, one.signing_key.serialize_pem()).unwrap();

    // A client CA file with a key in it, not a certificate.
    let ca = dir.path().join("ca.crt");
    std::fs::write(&ca, one.signing_key.serialize_pem()).unwrap();
    let with_ca = ServerTls { client_ca: Some(ca), ..settings };
    let err = with_ca.load().unwrap_err();
    assert!(matches!(err, TlsError::Empty { what: "certificate", .. }), "{err}");
    assert!(err.to_string().contains("ca.crt"), "{err}");
}
