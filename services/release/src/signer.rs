//! The release role's signing key: an ed25519 seed in a file (hex), created on first start with its public
//! key written next to it (`<key>.pub`, hex) for agents to trust. The key id is the first 16 hex digits of
//! the SHA-256 of the public key.

use std::path::{Path, PathBuf};

use ed25519_dalek::{Signer as _, SigningKey};
use multipilot_schemas::payload::ReleaseCommand;
use sha2::{Digest, Sha256};

/// Why the key can't be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading or writing the key file.
    #[error("signing key {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file doesn't hold a 32-byte hex seed.
    #[error("signing key {0}: not 64 hex digits")]
    Format(PathBuf),
    /// The command couldn't be encoded for signing.
    #[error("encoding the command for signing: {0}")]
    Encode(String),
}

/// Signs release commands.
pub struct Signer {
    key: SigningKey,
    key_id: String,
    public_path: PathBuf,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("key_id", &self.key_id)
            .finish()
    }
}

/// The key id of a public key.
pub fn key_id(public: &[u8; 32]) -> String {
    hex::encode(Sha256::digest(public))[..16].to_string()
}

fn public_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".pub");
    PathBuf::from(p)
}

impl Signer {
    /// Loads the key, or creates it (mode 0600) with its `.pub` when the file doesn't exist.
    pub fn load_or_create(path: &Path) -> Result<Signer, Error> {
        let io = |source| Error::Io {
            path: path.to_path_buf(),
            source,
        };
        let key = match std::fs::read_to_string(path) {
            Ok(text) => {
                let bytes = hex::decode(text.trim()).map_err(|_| Error::Format(path.into()))?;
                let seed: [u8; 32] = bytes.try_into().map_err(|_| Error::Format(path.into()))?;
                SigningKey::from_bytes(&seed)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(io)?;
                }
                let seed: [u8; 32] = rand::random();
                let key = SigningKey::from_bytes(&seed);
                write_private(path, &hex::encode(seed)).map_err(io)?;
                tracing::info!(path = %path.display(), "created the release signing key");
                key
            }
            Err(e) => return Err(io(e)),
        };
        let public = key.verifying_key().to_bytes();
        let pub_path = public_path(path);
        // always (re)write the public key: agents trust this file
        std::fs::write(&pub_path, format!("{}\n", hex::encode(public))).map_err(|source| {
            Error::Io {
                path: pub_path.clone(),
                source,
            }
        })?;
        Ok(Signer {
            key_id: key_id(&public),
            key,
            public_path: pub_path,
        })
    }

    /// The key id commands carry.
    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// The public key, hex.
    pub fn public_hex(&self) -> String {
        hex::encode(self.key.verifying_key().to_bytes())
    }

    /// Where the public key was written.
    pub fn public_path(&self) -> &Path {
        &self.public_path
    }

    /// Sets `key_id` and `signature` of a command.
    pub fn sign(&self, cmd: &mut ReleaseCommand) -> Result<(), Error> {
        cmd.key_id = self.key_id.clone();
        cmd.signature.clear();
        let bytes = cmd
            .signing_bytes()
            .map_err(|e| Error::Encode(e.to_string()))?;
        cmd.signature = hex::encode(self.key.sign(&bytes).to_bytes());
        Ok(())
    }
}

#[cfg(unix)]
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(text.as_bytes())?;
    f.write_all(b"\n")?;
    f.sync_all()
}

#[cfg(not(unix))]
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    std::fs::write(path, format!("{text}\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_is_created_once_and_reloaded() {
        let dir = tempfile::tempdir().expect("dir");
        let p = dir.path().join("k/signing.key");
        let a = Signer::load_or_create(&p).expect("create");
        let b = Signer::load_or_create(&p).expect("load");
        assert_eq!(a.key_id(), b.key_id());
        assert_eq!(a.key_id().len(), 16);
        let pubhex = std::fs::read_to_string(dir.path().join("k/signing.key.pub")).expect("pub");
        assert_eq!(pubhex.trim(), a.public_hex());
        std::fs::write(dir.path().join("bad.key"), "zz").expect("write");
        assert!(Signer::load_or_create(&dir.path().join("bad.key")).is_err());
    }
}
