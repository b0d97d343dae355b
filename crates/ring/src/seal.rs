//! A ring's Leases sealed with the ring's key. Anyone who may write Leases in the
//! ring's namespace can write one that looks like a replica's; only the ring's
//! replicas hold the key (the page token key file they share with the routers). Each
//! replica signs what its Lease says (the Lease's name, its holder and every
//! annotation, the moment of signing among them) with a key derived from the ring's;
//! the replicas and routers count a Lease only when the signature holds, and only
//! when it was signed later than the last one they took of the same Lease, so that
//! an old Lease written back is not taken for a renewal.

use std::collections::BTreeMap;

use base64::Engine as _;

/// The annotation holding a Lease's signature (base64url, no padding).
pub const SIGNATURE: &str = "fleetscope.io/signature";
/// The annotation holding when a Lease was signed (milliseconds since the Unix
/// epoch, by its writer's clock; each signing of a Lease later than the last).
pub const SIGNED_AT: &str = "fleetscope.io/signed-at";

/// What the key is derived for: a Lease's signature is never a page token's.
const PURPOSE: &[u8] = b"fleetscope.io ring lease v1";

/// The key a ring's Leases are signed with.
#[derive(Clone)]
pub struct LeaseKey(ring::hmac::Key);

impl std::fmt::Debug for LeaseKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaseKey(..)")
    }
}

/// Why a Lease is not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// It carries no signature: not written by a replica of this ring.
    #[error("it carries no signature (not written by a replica of this ring)")]
    Unsigned,
    /// Its signature does not hold under this key: written by someone without the
    /// ring's key, edited since, or signed with another key.
    #[error(
        "its signature does not hold under this ring's key (edited by someone else, or this process was given another key than the replica's: check --shard-page-token-key-file)"
    )]
    BadSignature,
    /// Signed no later than the one already taken: an old Lease written back.
    #[error("it was signed no later than the one already taken (an old Lease written back)")]
    Replayed,
}

impl LeaseKey {
    /// The Lease key of a ring, derived from the ring's key by `derive` (given what
    /// the key is for, it returns a key for that purpose alone).
    pub fn derived(derive: impl FnOnce(&[u8]) -> ring::hmac::Key) -> Self {
        Self(derive(PURPOSE))
    }

    /// What a signature covers: each part with its length first, so that no two
    /// different Leases read the same.
    fn signed(name: &str, holder: Option<&str>, annotations: &BTreeMap<String, String>) -> Vec<u8> {
        let mut out = Vec::new();
        let mut part = |bytes: &[u8]| {
            out.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
            out.extend_from_slice(bytes);
        };
        part(name.as_bytes());
        match holder {
            Some(h) => {
                part(b"holder");
                part(h.as_bytes());
            }
            None => part(b"released"),
        }
        for (k, v) in annotations {
            if k != SIGNATURE {
                part(k.as_bytes());
                part(v.as_bytes());
            }
        }
        out
    }

    /// Signs the Lease `name` held by `holder` (`None`: released) with
    /// `annotations`: sets [`SIGNED_AT`] to `signed_at` and [`SIGNATURE`].
    pub fn seal(
        &self,
        name: &str,
        holder: Option<&str>,
        annotations: &mut BTreeMap<String, String>,
        signed_at: u64,
    ) {
        annotations.insert(SIGNED_AT.to_string(), signed_at.to_string());
        let tag = ring::hmac::sign(&self.0, &Self::signed(name, holder, annotations));
        annotations.insert(
            SIGNATURE.to_string(),
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(tag.as_ref()),
        );
    }

    /// When the Lease `name` held by `holder` with `annotations` was signed, if its
    /// signature holds.
    pub fn verify(
        &self,
        name: &str,
        holder: Option<&str>,
        annotations: &BTreeMap<String, String>,
    ) -> Result<u64, Refused> {
        let signature = annotations.get(SIGNATURE).ok_or(Refused::Unsigned)?;
        let tag = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(signature)
            .map_err(|_| Refused::BadSignature)?;
        ring::hmac::verify(&self.0, &Self::signed(name, holder, annotations), &tag)
            .map_err(|_| Refused::BadSignature)?;
        signed_at(annotations).ok_or(Refused::BadSignature)
    }
}

/// The moment a Lease's annotations say it was signed.
pub fn signed_at(annotations: &BTreeMap<String, String>) -> Option<u64> {
    annotations.get(SIGNED_AT)?.parse().ok()
}

/// The moment to sign a Lease at next: now by this clock, and always later than
/// `last` (the Lease as read), so that a clock behind its predecessor's never makes a
/// renewal look older than what it renews.
pub fn next_signing(last: Option<u64>) -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    now.max(last.map_or(0, |l| l.saturating_add(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> LeaseKey {
        LeaseKey::derived(|_| ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &[byte; 32]))
    }

    fn annotations() -> BTreeMap<String, String> {
        BTreeMap::from([
            (
                "fleetscope.io/address".to_string(),
                "10.0.0.1:50051".to_string(),
            ),
            ("fleetscope.io/ready".to_string(), "a,b".to_string()),
        ])
    }

    #[test]
    fn a_sealed_lease_verifies_and_any_change_or_other_key_does_not() {
        let k = key(1);
        let mut a = annotations();
        k.seal("ring-r1", Some("r1"), &mut a, 42);
        assert_eq!(k.verify("ring-r1", Some("r1"), &a), Ok(42));
        // Another key, another name, another holder, released, a changed or added
        // annotation, another moment: none holds.
        assert_eq!(
            key(2).verify("ring-r1", Some("r1"), &a),
            Err(Refused::BadSignature)
        );
        assert_eq!(
            k.verify("ring-r2", Some("r1"), &a),
            Err(Refused::BadSignature)
        );
        assert_eq!(
            k.verify("ring-r1", Some("r2"), &a),
            Err(Refused::BadSignature)
        );
        assert_eq!(k.verify("ring-r1", None, &a), Err(Refused::BadSignature));
        for (name, value) in [
            ("fleetscope.io/ready", "a,b,c"),
            ("fleetscope.io/address", "10.0.0.2:50051"),
            ("fleetscope.io/unowned", "ghost"),
            (SIGNED_AT, "43"),
            (SIGNATURE, "AAAA"),
        ] {
            let mut changed = a.clone();
            changed.insert(name.into(), value.into());
            assert!(k.verify("ring-r1", Some("r1"), &changed).is_err(), "{name}");
        }
        let mut unsigned = a.clone();
        unsigned.remove(SIGNATURE);
        assert_eq!(
            k.verify("ring-r1", Some("r1"), &unsigned),
            Err(Refused::Unsigned)
        );
        // Parts that would run together without their lengths stay apart.
        let mut b = BTreeMap::from([("ab".to_string(), "c".to_string())]);
        k.seal("n", Some("h"), &mut b, 1);
        let mut moved = BTreeMap::from([("a".to_string(), "bc".to_string())]);
        moved.insert(SIGNATURE.into(), b[SIGNATURE].clone());
        moved.insert(SIGNED_AT.into(), "1".into());
        assert_eq!(k.verify("n", Some("h"), &moved), Err(Refused::BadSignature));
    }

    #[test]
    fn each_signing_is_later_than_the_last_whatever_the_clock() {
        let now = next_signing(None);
        assert!(next_signing(Some(now)) > now);
        assert_eq!(next_signing(Some(u64::MAX - 1)), u64::MAX);
        assert!(next_signing(Some(0)) > 1);
    }
}
