//! Where the tables' files live: a local directory, or an object store (`file://`, `s3://`).
//!
//! Everything above this module speaks of keys (`samples/date=2026-06-01/part-....parquet`,
//! relative to the data directory) and of finished files: a writer writes a file under a
//! local staging name and [`Objects::publish`]es it whole, so a reader never sees half of
//! one. A local directory publishes by `fsync` and `rename` (and `fsync` of the directory);
//! an object store by one `PUT` (a multipart upload past [`MULTIPART_BYTES`]), which S3 makes
//! durable and visible at once. `file://` goes through `object_store`'s local backend, the
//! same code as a bucket: it is how that code is tested here, and it does not `fsync` (the
//! backend does not), so a plain path is the choice for a local disk.
//!
//! `object_store` is async and the store's writers are not (they run on the flush thread and
//! the ingest path's blocking pool), so a remote root owns a small runtime of its own and each
//! call waits for its future there; that works from any thread, inside a runtime or not.

use std::fs;
use std::io::{Read, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};

use crate::{io_err, Error, Result};

/// A finished file larger than this is uploaded in parts of this size.
pub const MULTIPART_BYTES: usize = 16 << 20;

/// One stored file: its key and size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub size: u64,
}

/// Where DataFusion lists a table, and the store to register for that URL's scheme and host
/// when it is not the local file system.
pub type TableUrl = (String, Option<(url::Url, Arc<dyn ObjectStore>)>);

/// The data directory's tables: a local directory or an object-store prefix.
#[derive(Clone, Debug)]
pub enum Objects {
    Local(PathBuf),
    Remote(Arc<Remote>),
}

/// An object-store prefix, with the runtime its calls run on and a local staging directory.
pub struct Remote {
    url: url::Url,
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    staging: PathBuf,
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Remote")
            .field("url", &self.url.as_str())
            .field("staging", &self.staging)
            .finish()
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        // Dropping a runtime may block, which panics inside another runtime's task.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// Whether a data directory given on the command line is a URL (`scheme://...`).
pub fn is_url(text: &str) -> bool {
    text.split_once("://").is_some_and(|(scheme, _)| {
        !scheme.is_empty()
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '+')
    })
}

/// Builds the store for `url`: S3's settings come from the `AWS_*` environment variables
/// (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL`,
/// `AWS_ALLOW_HTTP`, ...) as the AWS tools read them.
fn build_store(url: &url::Url) -> Result<(Arc<dyn ObjectStore>, ObjectPath)> {
    let settings = std::env::vars().filter(|(k, _)| k.starts_with("AWS_"));
    let (store, prefix) =
        object_store::parse_url_opts(url, settings).map_err(|e| match url.scheme() {
            "s3" | "s3a" | "file" => Error::Config(format!("data directory {url}: {e}")),
            other => Error::Config(format!(
                "data directory {url}: `{other}://` is not supported; use a local path, file:// or s3:// ({e})"
            )),
        })?;
    Ok((Arc::from(store), prefix))
}

impl Objects {
    /// A local directory, created if missing.
    pub fn local(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        fs::create_dir_all(&root).map_err(io_err(&root))?;
        Ok(Objects::Local(root))
    }

    /// An object-store URL; finished files are staged under `staging` (local) first.
    pub fn remote(url: &str, staging: impl Into<PathBuf>) -> Result<Self> {
        let url = url::Url::parse(url)
            .map_err(|e| Error::Config(format!("data directory {url}: not a URL: {e}")))?;
        let (store, prefix) = build_store(&url)?;
        let staging = staging.into();
        fs::create_dir_all(&staging).map_err(io_err(&staging))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("object-store")
            .enable_all()
            .build()
            .map_err(io_err(&staging))?;
        Ok(Objects::Remote(Arc::new(Remote {
            url,
            store,
            prefix,
            staging,
            runtime: Some(runtime),
        })))
    }

    /// A path or a URL, as `--data-dir` takes it; `staging` is used only for a URL.
    pub fn parse(text: &str, staging: impl Into<PathBuf>) -> Result<Self> {
        if is_url(text) {
            Objects::remote(text, staging)
        } else {
            Objects::local(text)
        }
    }

    /// The local directory, for a local root.
    pub fn local_root(&self) -> Option<&Path> {
        match self {
            Objects::Local(root) => Some(root),
            Objects::Remote(_) => None,
        }
    }

    /// What to print for this root.
    pub fn display(&self) -> String {
        match self {
            Objects::Local(root) => root.display().to_string(),
            Objects::Remote(r) => r.url.to_string(),
        }
    }

    /// The URL DataFusion lists a table directory (`samples`, `rollups/hourly`) at, and the
    /// store to register for it, when it is not the local file system.
    pub fn table_url(&self, dir: &str) -> Result<TableUrl> {
        match self {
            Objects::Local(root) => {
                let path = root.join(dir);
                fs::create_dir_all(&path).map_err(io_err(&path))?;
                let abs = path.canonicalize().map_err(io_err(&path))?;
                Ok((format!("{}/", abs.display()), None))
            }
            Objects::Remote(r) => {
                // A store of its own for the query engine: its connections then belong to the
                // engine's runtime, not to ours.
                let (store, _) = build_store(&r.url)?;
                let mut base = r.url.clone();
                base.set_path("");
                let prefix = r.prefix.as_ref().trim_end_matches('/');
                let joined = if prefix.is_empty() {
                    format!("/{dir}/")
                } else {
                    format!("/{prefix}/{dir}/")
                };
                let mut url = r.url.clone();
                url.set_path(&joined);
                Ok((url.to_string(), Some((base, store))))
            }
        }
    }

    /// Every file under `prefix` (a key or a key's directory), recursively, by key.
    pub fn list(&self, prefix: &str) -> Result<Vec<Entry>> {
        let mut out = match self {
            Objects::Local(root) => {
                let mut out = Vec::new();
                list_local(root, &root.join(prefix), &mut out)?;
                out
            }
            Objects::Remote(r) => r.list(prefix)?,
        };
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// Where a new file that will be published at `key` is written meanwhile: beside it for a
    /// local root (so the rename stays on one file system), in the staging directory for a
    /// remote one. The name starts with `.` and ends `.tmp`, which no reader lists.
    pub fn staging_path(&self, key: &str) -> Result<PathBuf> {
        let name = key.rsplit('/').next().unwrap_or(key);
        match self {
            Objects::Local(root) => {
                let path = root.join(key);
                let dir = path.parent().unwrap_or(root);
                fs::create_dir_all(dir).map_err(io_err(dir))?;
                Ok(dir.join(format!(".{name}.tmp")))
            }
            Objects::Remote(r) => Ok(r.staging.join(format!(".{name}.tmp"))),
        }
    }

    /// The staging files a crash left, whose names start with `starts_with` after the dot.
    pub fn remove_staged(&self, starts_with: &str) -> Result<usize> {
        let dir = match self {
            Objects::Local(_) => return Ok(0), // beside their keys: found by `list`
            Objects::Remote(r) => r.staging.clone(),
        };
        let mut removed = 0;
        for entry in fs::read_dir(&dir).map_err(io_err(&dir))? {
            let path = entry.map_err(io_err(&dir))?.path();
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            if name.starts_with(&format!(".{starts_with}")) && name.ends_with(".tmp") {
                fs::remove_file(&path).map_err(io_err(&path))?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Makes a finished staging file the file at `key`, whole and durable, and removes the
    /// staging file.
    pub fn publish(&self, staged: &Path, key: &str) -> Result<()> {
        match self {
            Objects::Local(root) => {
                let path = root.join(key);
                fs::File::open(staged)
                    .and_then(|f| f.sync_all())
                    .map_err(io_err(staged))?;
                fs::rename(staged, &path).map_err(io_err(&path))?;
                sync_parent(&path)
            }
            Objects::Remote(r) => {
                r.upload(staged, key)?;
                fs::remove_file(staged).map_err(io_err(staged))
            }
        }
    }

    /// Writes a small file (a journal, a note) whole.
    pub fn put(&self, key: &str, bytes: Vec<u8>) -> Result<()> {
        match self {
            Objects::Local(root) => {
                let path = root.join(key);
                if let Some(dir) = path.parent() {
                    fs::create_dir_all(dir).map_err(io_err(dir))?;
                }
                let tmp = self.staging_path(key)?;
                let mut f = fs::File::create(&tmp).map_err(io_err(&tmp))?;
                f.write_all(&bytes)
                    .and_then(|()| f.sync_all())
                    .map_err(io_err(&tmp))?;
                fs::rename(&tmp, &path).map_err(io_err(&path))?;
                sync_parent(&path)
            }
            Objects::Remote(r) => r.put(key, bytes),
        }
    }

    /// A file's bytes; `None` when there is none.
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        match self {
            Objects::Local(root) => {
                let path = root.join(key);
                match fs::read(&path) {
                    Ok(b) => Ok(Some(b)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(io_err(&path)(e)),
                }
            }
            Objects::Remote(r) => r.get(key),
        }
    }

    /// Whether a file is at `key`.
    pub fn exists(&self, key: &str) -> Result<bool> {
        match self {
            Objects::Local(root) => Ok(root.join(key).exists()),
            Objects::Remote(r) => r.exists(key),
        }
    }

    /// Deletes a file; one already gone is not an error. Says whether it was there.
    pub fn delete(&self, key: &str) -> Result<bool> {
        match self {
            Objects::Local(root) => {
                let path = root.join(key);
                match fs::remove_file(&path) {
                    Ok(()) => Ok(true),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
                    Err(e) => Err(io_err(&path)(e)),
                }
            }
            Objects::Remote(r) => r.delete(key),
        }
    }

    /// Makes the deletions and renames of a directory durable (a local root's); a no-op for
    /// a store, whose deletes are.
    pub fn sync_dir(&self, key_dir: &str) -> Result<()> {
        match self {
            Objects::Local(root) => crate::wal::sync_dir(&root.join(key_dir)),
            Objects::Remote(_) => Ok(()),
        }
    }

    /// Deletes everything under a directory key (a partition).
    pub fn delete_dir(&self, key_dir: &str) -> Result<()> {
        match self {
            Objects::Local(root) => {
                let path = root.join(key_dir);
                match fs::remove_dir_all(&path) {
                    Ok(()) => Ok(()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                    Err(e) => Err(io_err(&path)(e)),
                }
            }
            Objects::Remote(r) => {
                let keys: Vec<String> = self.list(key_dir)?.into_iter().map(|e| e.key).collect();
                r.delete_all(key_dir, &keys)
            }
        }
    }

    /// Moves a file to another key (quarantine).
    pub fn rename(&self, from: &str, to: &str) -> Result<()> {
        match self {
            Objects::Local(root) => {
                let (src, dst) = (root.join(from), root.join(to));
                if let Some(dir) = dst.parent() {
                    fs::create_dir_all(dir).map_err(io_err(dir))?;
                }
                fs::rename(&src, &dst).map_err(io_err(&dst))?;
                sync_parent(&dst)?;
                sync_parent(&src)
            }
            Objects::Remote(r) => r.rename(from, to),
        }
    }

    /// A reader of one file for the Parquet readers: the file itself for a local root, ranged
    /// GETs for a store (a footer check reads the footer, not the file).
    pub fn reader(&self, entry: &Entry) -> Result<FileReader> {
        match self {
            Objects::Local(root) => {
                let path = root.join(&entry.key);
                let file = fs::File::open(&path).map_err(io_err(&path))?;
                Ok(FileReader::Local(file))
            }
            Objects::Remote(r) => Ok(FileReader::Remote {
                remote: Arc::clone(r),
                key: entry.key.clone(),
                size: entry.size,
            }),
        }
    }
}

fn sync_parent(path: &Path) -> Result<()> {
    match path.parent() {
        Some(dir) => crate::wal::sync_dir(dir),
        None => Ok(()),
    }
}

fn list_local(root: &Path, dir: &Path, out: &mut Vec<Entry>) -> Result<()> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err(dir)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(io_err(dir))?;
        let path = entry.path();
        let kind = entry.file_type().map_err(io_err(&path))?;
        if kind.is_dir() {
            list_local(root, &path, out)?;
        } else if kind.is_file() {
            let size = entry.metadata().map_err(io_err(&path))?.len();
            let key = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .to_string_lossy()
                .replace(std::path::MAIN_SEPARATOR, "/");
            out.push(Entry { key, size });
        }
    }
    Ok(())
}

impl Remote {
    fn path(&self, key: &str) -> ObjectPath {
        let mut path = self.prefix.clone();
        for part in key.split('/').filter(|p| !p.is_empty()) {
            path = path.clone().join(part);
        }
        path
    }

    fn key_of(&self, path: &ObjectPath) -> String {
        path.prefix_match(&self.prefix)
            .map(|parts| {
                parts
                    .map(|p| p.as_ref().to_owned())
                    .collect::<Vec<_>>()
                    .join("/")
            })
            .unwrap_or_else(|| path.to_string())
    }

    fn object_err(&self, key: &str) -> impl FnOnce(object_store::Error) -> Error + '_ {
        let key = key.to_owned();
        move |source| Error::ObjectStore {
            location: format!("{}/{key}", self.url.as_str().trim_end_matches('/')),
            source,
        }
    }

    /// Runs a future on this root's runtime and waits for it, from any thread.
    fn block<F>(&self, future: F) -> F::Output
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let (tx, rx) = std::sync::mpsc::channel();
        let Some(rt) = self.runtime.as_ref() else {
            unreachable!("the runtime lives until the root is dropped");
        };
        rt.spawn(async move {
            let _ = tx.send(future.await);
        });
        match rx.recv() {
            Ok(out) => out,
            // The task panicked: surface it here, where the caller is.
            Err(_) => panic!("object-store task ended without an answer"),
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<Entry>> {
        let store = Arc::clone(&self.store);
        let path = self.path(prefix);
        let found: Vec<object_store::ObjectMeta> = self
            .block(async move { store.list(Some(&path)).try_collect().await })
            .map_err(self.object_err(prefix))?;
        Ok(found
            .into_iter()
            .map(|meta| Entry {
                key: self.key_of(&meta.location),
                size: meta.size,
            })
            .collect())
    }

    fn upload(&self, staged: &Path, key: &str) -> Result<()> {
        let size = fs::metadata(staged).map_err(io_err(staged))?.len();
        let store = Arc::clone(&self.store);
        let path = self.path(key);
        if size <= MULTIPART_BYTES as u64 {
            let bytes = fs::read(staged).map_err(io_err(staged))?;
            return self
                .block(async move { store.put(&path, PutPayload::from(bytes)).await })
                .map(drop)
                .map_err(self.object_err(key));
        }
        let staged_path = staged.to_path_buf();
        self.block(async move {
            let read_err = |e: std::io::Error| object_store::Error::Generic {
                store: "staging",
                source: Box::new(e),
            };
            let mut file = fs::File::open(&staged_path).map_err(read_err)?;
            let upload = store.put_multipart(&path).await?;
            let mut writer = WriteMultipart::new_with_chunk_size(upload, MULTIPART_BYTES);
            let mut chunk = vec![0u8; MULTIPART_BYTES];
            loop {
                let n = match file.read(&mut chunk) {
                    Ok(n) => n,
                    Err(e) => {
                        let _ = writer.abort().await;
                        return Err(read_err(e));
                    }
                };
                if n == 0 {
                    break;
                }
                // At most two parts in flight: memory stays a few chunks whatever the size.
                if let Err(e) = writer.wait_for_capacity(2).await {
                    let _ = writer.abort().await;
                    return Err(e);
                }
                writer.write(&chunk[..n]);
            }
            writer.finish().await
        })
        .map(drop)
        .map_err(self.object_err(key))
    }

    fn put(&self, key: &str, bytes: Vec<u8>) -> Result<()> {
        let store = Arc::clone(&self.store);
        let path = self.path(key);
        self.block(async move { store.put(&path, PutPayload::from(bytes)).await })
            .map(drop)
            .map_err(self.object_err(key))
    }

    fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let store = Arc::clone(&self.store);
        let path = self.path(key);
        let got = self.block(async move {
            match store.get(&path).await {
                Ok(r) => r.bytes().await.map(Some),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        });
        got.map(|b| b.map(|b| b.to_vec()))
            .map_err(self.object_err(key))
    }

    fn get_range(&self, key: &str, range: Range<u64>) -> Result<Bytes> {
        let store = Arc::clone(&self.store);
        let path = self.path(key);
        self.block(async move { store.get_range(&path, range).await })
            .map_err(self.object_err(key))
    }

    fn exists(&self, key: &str) -> Result<bool> {
        let store = Arc::clone(&self.store);
        let path = self.path(key);
        match self.block(async move { store.head(&path).await }) {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(self.object_err(key)(e)),
        }
    }

    fn delete(&self, key: &str) -> Result<bool> {
        if !self.exists(key)? {
            return Ok(false);
        }
        let store = Arc::clone(&self.store);
        let path = self.path(key);
        match self.block(async move { store.delete(&path).await }) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(true),
            Err(e) => Err(self.object_err(key)(e)),
        }
    }

    /// Deletes the keys of a directory in bulk (S3's DeleteObjects: a thousand keys a request);
    /// keys already gone are not an error.
    fn delete_all(&self, key_dir: &str, keys: &[String]) -> Result<()> {
        let store = Arc::clone(&self.store);
        let paths: Vec<object_store::Result<ObjectPath>> =
            keys.iter().map(|key| Ok(self.path(key))).collect();
        let results: Vec<object_store::Result<ObjectPath>> = self.block(async move {
            use futures_util::StreamExt;
            store
                .delete_stream(futures_util::stream::iter(paths).boxed())
                .collect()
                .await
        });
        for result in results {
            match result {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(self.object_err(key_dir)(e)),
            }
        }
        Ok(())
    }

    fn rename(&self, from: &str, to: &str) -> Result<()> {
        let store = Arc::clone(&self.store);
        let (src, dst) = (self.path(from), self.path(to));
        self.block(async move { store.rename(&src, &dst).await })
            .map_err(self.object_err(from))
    }
}

/// One file opened for the Parquet readers ([`parquet::file::reader::ChunkReader`]).
#[derive(Debug)]
pub enum FileReader {
    Local(fs::File),
    Remote {
        remote: Arc<Remote>,
        key: String,
        size: u64,
    },
}

impl parquet::file::reader::Length for FileReader {
    fn len(&self) -> u64 {
        match self {
            FileReader::Local(f) => f.len(),
            FileReader::Remote { size, .. } => *size,
        }
    }
}

impl parquet::file::reader::ChunkReader for FileReader {
    type T = Box<dyn Read + Send>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        match self {
            FileReader::Local(f) => Ok(Box::new(f.get_read(start)?)),
            FileReader::Remote { size, .. } => {
                let bytes = self.get_bytes(start, (size.saturating_sub(start)) as usize)?;
                Ok(Box::new(std::io::Cursor::new(bytes)))
            }
        }
    }

    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<Bytes> {
        match self {
            FileReader::Local(f) => f.get_bytes(start, length),
            FileReader::Remote { remote, key, .. } => remote
                .get_range(key, start..start + length as u64)
                .map_err(|e| parquet::errors::ParquetError::External(Box::new(e))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::file::reader::{ChunkReader, Length};

    /// A path, and the same kind of directory as a `file://` URL through `object_store`.
    fn both(dir: &Path) -> Vec<Objects> {
        let tables = dir.join("remote");
        fs::create_dir_all(&tables).unwrap();
        let url = format!("file://{}", tables.display());
        vec![
            Objects::local(dir.join("local")).unwrap(),
            Objects::remote(&url, dir.join("staging")).unwrap(),
        ]
    }

    #[test]
    fn keys_are_listed_read_renamed_and_deleted_alike_on_a_path_and_a_store() {
        let dir = tempfile::tempdir().unwrap();
        for objects in both(dir.path()) {
            objects
                .put("jobs/date=2026-06-01/a.json", b"{}".to_vec())
                .unwrap();
            objects
                .put("jobs/date=2026-06-02/b.json", b"[1]".to_vec())
                .unwrap();
            objects.put("samples/c.json", b"x".to_vec()).unwrap();
            let keys: Vec<(String, u64)> = objects
                .list("jobs")
                .unwrap()
                .into_iter()
                .map(|e| (e.key, e.size))
                .collect();
            assert_eq!(
                keys,
                vec![
                    ("jobs/date=2026-06-01/a.json".to_owned(), 2),
                    ("jobs/date=2026-06-02/b.json".to_owned(), 3)
                ],
                "{objects:?}"
            );
            assert!(objects.list("nothing/here").unwrap().is_empty());
            objects
                .rename("jobs/date=2026-06-01/a.json", "quarantine/jobs/a.json")
                .unwrap();
            assert!(!objects.exists("jobs/date=2026-06-01/a.json").unwrap());
            assert_eq!(
                objects.get("quarantine/jobs/a.json").unwrap().as_deref(),
                Some(&b"{}"[..])
            );
            assert!(objects.delete("quarantine/jobs/a.json").unwrap());
            assert!(!objects.delete("quarantine/jobs/a.json").unwrap());
            assert_eq!(objects.get("quarantine/jobs/a.json").unwrap(), None);
            objects.delete_dir("jobs/date=2026-06-02").unwrap();
            assert!(objects.list("jobs").unwrap().is_empty());
            assert_eq!(objects.list("samples").unwrap().len(), 1);
        }
    }

    #[test]
    fn a_file_past_the_multipart_size_is_published_whole_and_read_back_in_ranges() {
        let dir = tempfile::tempdir().unwrap();
        for objects in both(dir.path()) {
            let key = "samples/date=2026-06-01/part-big.parquet";
            let staged = objects.staging_path(key).unwrap();
            let len = 2 * MULTIPART_BYTES + 12_345;
            let bytes: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            fs::write(&staged, &bytes).unwrap();
            objects.publish(&staged, key).unwrap();
            assert!(!staged.exists(), "the staging file is gone");
            let entry = objects.list("samples").unwrap().remove(0);
            assert_eq!(
                entry,
                Entry {
                    key: key.to_owned(),
                    size: len as u64
                }
            );
            assert!(objects.get(key).unwrap().unwrap() == bytes, "{objects:?}");
            let reader = objects.reader(&entry).unwrap();
            assert_eq!(reader.len(), len as u64);
            let start = MULTIPART_BYTES as u64 - 7;
            let part = reader.get_bytes(start, 100).unwrap();
            assert_eq!(&part[..], &bytes[start as usize..start as usize + 100]);
            let mut tail = Vec::new();
            reader
                .get_read(len as u64 - 10)
                .unwrap()
                .read_to_end(&mut tail)
                .unwrap();
            assert_eq!(tail, &bytes[len - 10..]);
        }
    }

    #[test]
    fn a_url_of_an_unknown_scheme_is_refused_naming_what_works() {
        let dir = tempfile::tempdir().unwrap();
        let err = Objects::parse("gopher://host/x", dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("gopher://") && err.contains("s3://"), "{err}");
        assert!(is_url("s3://bucket/prefix") && is_url("file:///tmp/x"));
        assert!(!is_url("/tmp/x") && !is_url("relative/dir") && !is_url("c:\\data"));
    }
}
