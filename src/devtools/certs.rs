//! Throw-away certificates for the TLS tests and `tally-dev certs`: a CA, a
//! server certificate for `localhost` / `127.0.0.1` signed by it, a client
//! certificate signed by it (mTLS), and a second, unrelated CA (the "wrong CA").
//! Generated with the system OpenSSL that librdkafka and the PostgreSQL
//! connector use; never for production.
//!
//! Files written to the directory (PEM): `ca.pem`, `ca.key`, `server.pem`,
//! `server.key`, `client.pem`, `client.key` (encrypted with the given password,
//! or plain), `other-ca.pem`.

use std::path::Path;

use anyhow::Context;
use openssl::asn1::Asn1Time;
use openssl::bn::{BigNum, MsbOption};
use openssl::hash::MessageDigest;
use openssl::pkey::{PKey, Private};
use openssl::rsa::Rsa;
use openssl::symm::Cipher;
use openssl::x509::extension::{
    BasicConstraints, ExtendedKeyUsage, KeyUsage, SubjectAlternativeName,
};
use openssl::x509::{X509NameBuilder, X509};

type Pair = (X509, PKey<Private>);

fn key() -> anyhow::Result<PKey<Private>> {
    Ok(PKey::from_rsa(Rsa::generate(2048)?)?)
}

fn cert(cn: &str, issuer: Option<&Pair>, leaf: Option<Leaf>) -> anyhow::Result<Pair> {
    let key = key()?;
    let mut name = X509NameBuilder::new()?;
    name.append_entry_by_text("CN", cn)?;
    let name = name.build();
    let mut b = X509::builder()?;
    b.set_version(2)?;
    let mut serial = BigNum::new()?;
    serial.rand(127, MsbOption::MAYBE_ZERO, false)?;
    let serial = serial.to_asn1_integer()?;
    b.set_serial_number(&serial)?;
    b.set_subject_name(&name)?;
    b.set_issuer_name(issuer.map_or(&name, |(c, _)| c.subject_name()))?;
    b.set_pubkey(&key)?;
    let (from, until) = (Asn1Time::days_from_now(0)?, Asn1Time::days_from_now(30)?);
    b.set_not_before(&from)?;
    b.set_not_after(&until)?;
    match leaf {
        None => {
            b.append_extension(BasicConstraints::new().critical().ca().build()?)?;
            b.append_extension(
                KeyUsage::new()
                    .critical()
                    .key_cert_sign()
                    .crl_sign()
                    .build()?,
            )?;
        }
        Some(kind) => {
            b.append_extension(BasicConstraints::new().build()?)?;
            b.append_extension(
                KeyUsage::new()
                    .critical()
                    .digital_signature()
                    .key_encipherment()
                    .build()?,
            )?;
            let mut eku = ExtendedKeyUsage::new();
            match kind {
                Leaf::Server => {
                    eku.server_auth();
                    let ctx = b.x509v3_context(issuer.map(|(c, _)| c.as_ref()), None);
                    let san = SubjectAlternativeName::new()
                        .dns("localhost")
                        .ip("127.0.0.1")
                        .build(&ctx)?;
                    b.append_extension(san)?;
                }
                Leaf::Client => {
                    eku.client_auth();
                }
            }
            b.append_extension(eku.build()?)?;
        }
    }
    let signer = issuer.map_or(&key, |(_, k)| k);
    b.sign(signer, MessageDigest::sha256())?;
    Ok((b.build(), key))
}

#[derive(Clone, Copy)]
enum Leaf {
    Server,
    Client,
}

/// Writes the set into `dir`; `client_key_password` encrypts `client.key`
/// (AES-256-CBC, PKCS#8) when given.
pub fn generate(dir: &Path, client_key_password: Option<&str>) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let ca = cert("tally test CA", None, None)?;
    let server = cert("localhost", Some(&ca), Some(Leaf::Server))?;
    let client = cert("tally-client", Some(&ca), Some(Leaf::Client))?;
    let other = cert("some other CA", None, None)?;
    let client_key = match client_key_password {
        Some(pw) => client
            .1
            .private_key_to_pem_pkcs8_passphrase(Cipher::aes_256_cbc(), pw.as_bytes())?,
        None => client.1.private_key_to_pem_pkcs8()?,
    };
    let files: [(&str, Vec<u8>); 7] = [
        ("ca.pem", ca.0.to_pem()?),
        ("ca.key", ca.1.private_key_to_pem_pkcs8()?),
        ("server.pem", server.0.to_pem()?),
        ("server.key", server.1.private_key_to_pem_pkcs8()?),
        ("client.pem", client.0.to_pem()?),
        ("client.key", client_key),
        ("other-ca.pem", other.0.to_pem()?),
    ];
    for (name, bytes) in files {
        let path = dir.join(name);
        std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
