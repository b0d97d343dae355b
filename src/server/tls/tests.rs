use super::*;

fn cert_with(params: impl FnOnce(&mut rcgen::CertificateParams)) -> Vec<u8> {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name = rcgen::DistinguishedName::new();
    params(&mut p);
    p.self_signed(&key).unwrap().der().to_vec()
}

#[test]
fn a_client_certificate_names_its_uri_san_else_its_cn_with_groups_from_o() {
    let spiffe = cert_with(|p| {
        p.subject_alt_names = vec![rcgen::SanType::URI(
            "spiffe://example.org/ns/a/sa/b".try_into().unwrap(),
        )];
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "ignored");
        p.distinguished_name
            .push(rcgen::DnType::OrganizationName, "team-a");
    });
    let s = certificate_subject(&spiffe).unwrap();
    assert_eq!(s.user, "spiffe://example.org/ns/a/sa/b");
    assert_eq!(s.groups, ["team-a"]);
    let cn = cert_with(|p| {
        p.distinguished_name
            .push(rcgen::DnType::CommonName, "alice");
    });
    assert_eq!(certificate_subject(&cn).unwrap().user, "alice");
    let nobody = cert_with(|_| {});
    assert!(
        certificate_subject(&nobody)
            .unwrap_err()
            .contains("names no one")
    );
    assert!(certificate_subject(b"junk").is_err());
}

#[test]
fn bad_files_are_named_with_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let path = |n: &str| dir.path().join(n);
    std::fs::write(path("empty.pem"), "").unwrap();
    std::fs::write(
        path("junk.pem"),
        "-----BEGIN CERTIFICATE-----\n!!!\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let files = |cert: &str, key: &str| TlsFiles {
        cert: path(cert),
        key: path(key),
        client_ca: None,
    };
    let e = server_config(&files("missing.pem", "empty.pem")).unwrap_err();
    assert!(e.to_string().contains("missing.pem"), "{e}");
    let e = server_config(&files("empty.pem", "empty.pem")).unwrap_err();
    assert!(
        e.to_string()
            .contains("empty.pem: the certificate holds no PEM"),
        "{e}"
    );
    let e = server_config(&files("junk.pem", "empty.pem")).unwrap_err();
    assert!(e.to_string().contains("junk.pem"), "{e}");
    // A good certificate with someone else's key.
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    std::fs::write(path("cert.pem"), cert.pem()).unwrap();
    std::fs::write(
        path("other.key"),
        rcgen::KeyPair::generate().unwrap().serialize_pem(),
    )
    .unwrap();
    std::fs::write(path("key.pem"), key.serialize_pem()).unwrap();
    let e = server_config(&files("cert.pem", "other.key")).unwrap_err();
    assert!(e.to_string().contains("does not go with"), "{e}");
    let e = server_config(&files("cert.pem", "empty.pem")).unwrap_err();
    assert!(
        e.to_string().contains("empty.pem: no usable private key"),
        "{e}"
    );
    assert!(server_config(&files("cert.pem", "key.pem")).is_ok());
    let mut with_ca = files("cert.pem", "key.pem");
    with_ca.client_ca = Some(path("junk.pem"));
    let e = server_config(&with_ca).unwrap_err();
    assert!(e.to_string().contains("junk.pem"), "{e}");
}
