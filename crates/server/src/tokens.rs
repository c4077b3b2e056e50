//! Random secrets, their stored hashes, and constant-time comparison.
//!
//! Credentials (enrollment, refresh, access) use the split-token form
//! `<kind>_<selector>.<verifier>`: the 64-bit `selector` finds the row, the 256-bit
//! `verifier` is stored only as a SHA-256 hash and compared in constant time. Lease
//! tokens need no selector (the item id finds the row); they are 192 random bits.
//! No secret is ever logged: [`Secret`]'s `Debug` prints a placeholder.

use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// A secret string handed to a client once; `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Hex SHA-256 of `secret`: what the database stores instead of the secret.
pub fn hash(secret: &str) -> String {
    hex::encode(Sha256::digest(secret.as_bytes()))
}

/// Constant-time equality of two stored hashes (or any two strings of public length).
pub fn ct_eq(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// `bytes` random bytes as hex, from the thread-local CSPRNG (`rand::thread_rng`:
/// ChaCha12 seeded and periodically reseeded from the OS), so a claim makes no
/// `getrandom` system call of its own.
fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    rand::thread_rng().fill_bytes(&mut buf);
    hex::encode(buf)
}

/// A fresh lease token (192 random bits, hex) and its hash.
pub fn new_lease_token() -> (Secret, String) {
    let token = random_hex(24);
    let hashed = hash(&token);
    (Secret(token), hashed)
}

/// What a credential is for; its prefix keeps tokens of one kind from being used as another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Single-use enrollment token (`ase_`).
    Enrollment,
    /// Single-use refresh token (`asr_`).
    Refresh,
    /// Short-lived access token (`asa_`).
    Access,
}

impl Kind {
    fn prefix(self) -> &'static str {
        match self {
            Kind::Enrollment => "ase_",
            Kind::Refresh => "asr_",
            Kind::Access => "asa_",
        }
    }
}

/// A freshly minted credential: the full secret for the client, and what to store.
#[derive(Debug)]
pub struct NewCredential {
    /// Give this to the client, once.
    pub secret: Secret,
    /// Row key (not secret on its own).
    pub selector: String,
    /// Hex SHA-256 of the verifier part.
    pub verifier_hash: String,
}

/// Mints a credential of `kind`.
pub fn new_credential(kind: Kind) -> NewCredential {
    let selector = random_hex(8);
    let verifier = random_hex(32);
    NewCredential {
        secret: Secret(format!("{}{selector}.{verifier}", kind.prefix())),
        selector,
        verifier_hash: hash(&verifier),
    }
}

/// A credential presented by a client, split into selector and verifier hash.
#[derive(Debug)]
pub struct Presented {
    /// Row key.
    pub selector: String,
    /// Hex SHA-256 of the presented verifier.
    pub verifier_hash: String,
}

/// Splits a presented credential of `kind`; `None` if it is not of that form.
pub fn parse_credential(kind: Kind, token: &str) -> Option<Presented> {
    let rest = token.strip_prefix(kind.prefix())?;
    let (selector, verifier) = rest.split_once('.')?;
    let hexish = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    if !hexish(selector, 16) || !hexish(verifier, 64) {
        return None;
    }
    Some(Presented {
        selector: selector.to_owned(),
        verifier_hash: hash(verifier),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_parse_back_only_as_their_own_kind() {
        let c = new_credential(Kind::Refresh);
        let p = parse_credential(Kind::Refresh, &c.secret.0).expect("parses");
        assert_eq!(p.selector, c.selector);
        assert!(ct_eq(&p.verifier_hash, &c.verifier_hash));
        assert!(parse_credential(Kind::Access, &c.secret.0).is_none());
        assert!(parse_credential(Kind::Refresh, "asr_zz.zz").is_none());
    }

    #[test]
    fn tokens_are_fresh_and_long_and_debug_hides_them() {
        let (a, ha) = new_lease_token();
        let (b, _) = new_lease_token();
        assert_ne!(a, b);
        assert!(a.0.len() * 4 >= 128);
        assert_eq!(ha, hash(&a.0));
        assert!(!format!("{a:?}").contains(&a.0));
        assert!(!ct_eq(&ha, &ha[1..]));
    }
}
