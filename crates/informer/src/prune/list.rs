//! A list response read as its bytes arrive: its own metadata kept, each item
//! pruned and handed on as soon as it is complete, so a list of any size is never
//! held whole as text.

use serde::Deserialize;
use serde::de::IgnoredAny;

use super::{PruneError, PrunedObject, Pruner, Pruning, prune_with};
use fleetscope_model::ResourceType;

/// A list response's own metadata.
#[derive(Debug, Default, Deserialize)]
pub struct ListMeta {
    /// The list's resourceVersion: where a WATCH after it starts.
    #[serde(rename = "resourceVersion", default)]
    pub resource_version: String,
    /// The token of the next page, if any.
    #[serde(rename = "continue", default)]
    pub continue_token: Option<String>,
    /// How many objects the pages after this one hold (an estimate, when the API
    /// server gives it).
    #[serde(rename = "remainingItemCount", default)]
    pub remaining_item_count: Option<u64>,
}

/// A LIST response read as its bytes arrive: each item is pruned as soon as its last
/// byte is in, and the bytes before it are let go, so pruning overlaps the transfer
/// and the whole body is never held. Nothing is decoded into a tree: every value kept
/// is copied through as the text it came as, in its order; one malformed item is an
/// error for that item alone. The same items, errors and metadata however the bytes
/// are split.
pub struct ListReader<'p> {
    pruner: Pruner<'p>,
    scratch: String,
    buf: Vec<u8>,
    /// Where scanning resumes in `buf`.
    at: usize,
    /// Where the token being scanned began (nothing before it is needed).
    token: usize,
    state: Expect,
    scan: Scan,
    key: String,
    meta: ListMeta,
}

/// What a [`ListReader`] expects next, at the list's top level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// The opening `{`.
    Open,
    /// A member's key, or `}`.
    Key,
    /// A member's key after a comma.
    KeyAfterComma,
    /// The `:` after a key.
    Colon,
    /// A member's value.
    Value,
    /// `,` or `}` after a member.
    AfterMember,
    /// `[` (or `null`) opening `items`.
    Items,
    /// An item, or `]`.
    Item,
    /// An item after a comma.
    ItemAfterComma,
    /// `,` or `]` after an item.
    AfterItem,
    /// Nothing: the list is complete.
    Done,
}

/// How far a JSON value has been scanned.
#[derive(Debug, Clone, Copy, Default)]
struct Scan {
    depth: u32,
    in_str: bool,
    escaped: bool,
    started: bool,
}

/// Why a LIST response could not be read.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ListError(String);

impl<'p> ListReader<'p> {
    /// A reader for a list of `rt`, pruned with `pruning`.
    pub fn new(rt: &ResourceType, pruning: &'p Pruning) -> Self {
        Self {
            pruner: Pruner::new(rt, pruning),
            scratch: String::new(),
            buf: Vec::new(),
            at: 0,
            token: 0,
            state: Expect::Open,
            scan: Scan::default(),
            key: String::new(),
            meta: ListMeta::default(),
        }
    }

    /// Takes the next bytes of the response; `each` receives every item completed by
    /// them, or why it was not kept.
    pub fn feed(
        &mut self,
        bytes: &[u8],
        each: &mut dyn FnMut(Result<PrunedObject, PruneError>),
    ) -> Result<(), ListError> {
        // Let go of what is done before taking more.
        if self.token > 0 && (self.token >= self.buf.len() / 2 || self.token >= 1 << 16) {
            self.buf.drain(..self.token);
            self.at -= self.token;
            self.token = 0;
        }
        self.buf.extend_from_slice(bytes);
        self.advance(false, each)
    }

    /// The end of the response: the list's metadata, or why the response was not a
    /// whole list.
    pub fn finish(
        mut self,
        each: &mut dyn FnMut(Result<PrunedObject, PruneError>),
    ) -> Result<ListMeta, ListError> {
        self.advance(true, each)?;
        if self.state != Expect::Done {
            return Err(ListError(format!(
                "the response ended inside the list (expecting {:?})",
                self.state
            )));
        }
        Ok(self.meta)
    }

    fn advance(
        &mut self,
        eof: bool,
        each: &mut dyn FnMut(Result<PrunedObject, PruneError>),
    ) -> Result<(), ListError> {
        loop {
            // Inside a value, scanning resumes where it stopped.
            if !self.scan.started {
                while self.at < self.buf.len() && self.buf[self.at].is_ascii_whitespace() {
                    self.at += 1;
                }
                self.token = self.at;
            }
            let Some(&b) = self.buf.get(self.at) else {
                if self.scan.started && eof && self.state == Expect::Value {
                    // A scalar runs to the end of the text.
                    return self.member_value(self.buf.len());
                }
                return Ok(());
            };
            if !self.step(b, eof, each)? {
                return Ok(());
            }
        }
    }

    /// One step at byte `b` (the next not yet taken): `false` when the text so far
    /// ends inside a token, which the next part completes.
    fn step(
        &mut self,
        b: u8,
        eof: bool,
        each: &mut dyn FnMut(Result<PrunedObject, PruneError>),
    ) -> Result<bool, ListError> {
        match self.state {
            Expect::Items | Expect::Item | Expect::ItemAfterComma | Expect::AfterItem => {
                self.step_in_items(b, eof, each)
            }
            _ => self.step_in_list(b, eof),
        }
    }

    /// A step in the list object itself: its keys, `metadata`, other members.
    fn step_in_list(&mut self, b: u8, eof: bool) -> Result<bool, ListError> {
        match self.state {
            Expect::Done => return self.unexpected(b, "the end of the response"),
            Expect::Open if b == b'{' => {
                self.at += 1;
                self.state = Expect::Key;
            }
            Expect::Open => return self.unexpected(b, "a JSON object"),
            Expect::Key if b == b'}' => {
                self.at += 1;
                self.state = Expect::Done;
            }
            Expect::Key | Expect::KeyAfterComma if b == b'"' || self.scan.started => {
                let Some(end) = self.scan_value(eof) else {
                    return Ok(false);
                };
                let text = std::str::from_utf8(&self.buf[self.token..end])
                    .map_err(|e| ListError(format!("a key is not UTF-8: {e}")))?;
                self.key = serde_json::from_str::<String>(text)
                    .map_err(|e| ListError(format!("a key is not a string: {e}")))?;
                self.at = end;
                self.state = Expect::Colon;
            }
            Expect::Key | Expect::KeyAfterComma => return self.unexpected(b, "a key"),
            Expect::Colon if b == b':' => {
                self.at += 1;
                self.state = if self.key == "items" {
                    Expect::Items
                } else {
                    Expect::Value
                };
            }
            Expect::Colon => return self.unexpected(b, "':'"),
            Expect::Value => {
                let Some(end) = self.scan_value(eof) else {
                    return Ok(false);
                };
                self.member_value(end)?;
            }
            Expect::AfterMember if b == b',' => {
                self.at += 1;
                self.state = Expect::KeyAfterComma;
            }
            Expect::AfterMember if b == b'}' => {
                self.at += 1;
                self.state = Expect::Done;
            }
            Expect::AfterMember => return self.unexpected(b, "',' or '}'"),
            Expect::Items | Expect::Item | Expect::ItemAfterComma | Expect::AfterItem => {}
        }
        Ok(true)
    }

    /// A step in `items`: each item pruned and handed to `each` as it completes.
    fn step_in_items(
        &mut self,
        b: u8,
        eof: bool,
        each: &mut dyn FnMut(Result<PrunedObject, PruneError>),
    ) -> Result<bool, ListError> {
        match self.state {
            Expect::Items if b == b'[' => {
                self.at += 1;
                self.state = Expect::Item;
            }
            Expect::Items if b == b'n' => {
                // `"items": null` is an empty list.
                if self.buf.len() < self.at + 4 {
                    if eof {
                        return self.unexpected(b, "null");
                    }
                    return Ok(false);
                }
                if &self.buf[self.at..self.at + 4] != b"null" {
                    return self.unexpected(b, "'[' or null");
                }
                self.at += 4;
                self.state = Expect::AfterMember;
            }
            Expect::Items => return self.unexpected(b, "'[' or null"),
            Expect::Item if b == b']' && !self.scan.started => {
                self.at += 1;
                self.state = Expect::AfterMember;
            }
            Expect::Item | Expect::ItemAfterComma => {
                let Some(end) = self.scan_value(eof) else {
                    return Ok(false);
                };
                let item = match std::str::from_utf8(&self.buf[self.token..end]) {
                    Ok(text) => prune_with(&self.pruner, &mut self.scratch, text),
                    Err(e) => Err(PruneError::NotAnObject(format!("not UTF-8: {e}"))),
                };
                each(item);
                self.at = end;
                self.token = end;
                self.state = Expect::AfterItem;
            }
            Expect::AfterItem if b == b',' => {
                self.at += 1;
                self.state = Expect::ItemAfterComma;
            }
            Expect::AfterItem if b == b']' => {
                self.at += 1;
                self.state = Expect::AfterMember;
            }
            Expect::AfterItem => return self.unexpected(b, "',' or ']'"),
            _ => {}
        }
        Ok(true)
    }

    /// The error for byte `b` where `what` was expected.
    fn unexpected(&self, b: u8, what: &str) -> Result<bool, ListError> {
        Err(ListError(format!(
            "not a list: expected {what}, found {:?} at byte {}",
            b as char, self.at
        )))
    }

    /// A top-level member's value ends at `end`: `metadata` is read, the rest skipped.
    fn member_value(&mut self, end: usize) -> Result<(), ListError> {
        if self.key == "metadata" {
            let text = std::str::from_utf8(&self.buf[self.token..end])
                .map_err(|e| ListError(format!("metadata is not UTF-8: {e}")))?;
            self.meta = serde_json::from_str(text)
                .map_err(|e| ListError(format!("metadata is not list metadata: {e}")))?;
        } else {
            let text = std::str::from_utf8(&self.buf[self.token..end]).unwrap_or("?");
            serde_json::from_str::<IgnoredAny>(text)
                .map_err(|e| ListError(format!("{:?} is not a JSON value: {e}", self.key)))?;
        }
        self.at = end;
        self.token = end;
        self.state = Expect::AfterMember;
        Ok(())
    }

    /// Scans the value starting at `self.token` from where the last call stopped;
    /// where it ends (exclusive), or `None` if more bytes are needed.
    fn scan_value(&mut self, eof: bool) -> Option<usize> {
        let buf = &self.buf;
        let s = &mut self.scan;
        if !s.started {
            s.started = true;
            s.depth = 0;
            s.in_str = false;
            s.escaped = false;
        }
        let first = buf[self.token];
        let scalar = !matches!(first, b'{' | b'[' | b'"');
        let mut i = self.at;
        while i < buf.len() {
            if s.in_str {
                if s.escaped {
                    s.escaped = false;
                    i += 1;
                    continue;
                }
                match memchr::memchr2(b'"', b'\\', &buf[i..]) {
                    None => {
                        i = buf.len();
                        break;
                    }
                    Some(k) => {
                        i += k;
                        if buf[i] == b'\\' {
                            s.escaped = true;
                        } else {
                            s.in_str = false;
                            if s.depth == 0 {
                                *s = Scan::default();
                                return Some(i + 1);
                            }
                        }
                        i += 1;
                    }
                }
                continue;
            }
            let b = buf[i];
            if scalar {
                if matches!(b, b',' | b'}' | b']') || b.is_ascii_whitespace() {
                    *s = Scan::default();
                    return Some(i);
                }
                i += 1;
                continue;
            }
            match b {
                b'"' => s.in_str = true,
                b'{' | b'[' => s.depth += 1,
                b'}' | b']' => {
                    s.depth = s.depth.saturating_sub(1);
                    if s.depth == 0 {
                        *s = Scan::default();
                        return Some(i + 1);
                    }
                }
                _ => {}
            }
            i += 1;
        }
        self.at = i;
        if scalar && eof {
            *s = Scan::default();
            return Some(i);
        }
        None
    }
}
