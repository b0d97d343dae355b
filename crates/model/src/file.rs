//! Reading a file a person configured (a kubeconfig, a policy, a certificate), bounded:
//! a path that names a device or a runaway file (`/dev/zero`) is an error naming it,
//! never a read until memory runs out.

use std::io::Read as _;
use std::path::Path;

/// The most fleetscope reads of one configured file: far above any kubeconfig,
/// policy, tokens file or certificate in use.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// The bytes of `path`, or an error when it cannot be read or holds more than
/// [`MAX_FILE_BYTES`].
pub fn read_capped(path: &Path) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "larger than {} MiB, the most read of one file",
                MAX_FILE_BYTES >> 20
            ),
        ));
    }
    Ok(bytes)
}

/// The text of `path`, as [`read_capped`] reads it; an error when it is not UTF-8.
pub fn read_text_capped(path: &Path) -> std::io::Result<String> {
    String::from_utf8(read_capped(path)?)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endless_file_is_refused_and_a_small_one_read() {
        let e = read_capped(Path::new("/dev/zero")).unwrap_err();
        assert!(e.to_string().contains("larger than 64 MiB"), "{e}");
        let dir = tempfile_dir();
        let p = dir.join("f");
        std::fs::write(&p, "x: 1\n").unwrap();
        assert_eq!(read_text_capped(&p).unwrap(), "x: 1\n");
        std::fs::write(&p, [0xff, 0xfe]).unwrap();
        assert!(read_text_capped(&p).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("fleetscope-model-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
