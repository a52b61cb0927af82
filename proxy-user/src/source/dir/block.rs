//! The YAML manifests are usually written in: block mappings and sequences
//! (what `kubectl get -o yaml` and most generators print), with flow
//! mappings and sequences inside them where people write by hand
//! (`metadata: {name: a, namespace: b}`, `ports: [{port: 80}]`), of
//! one-line scalars; read in one pass over the text into any
//! [`Deserialize`] type, strings borrowed from the text.
//!
//! A general YAML parser spends most of a Service's or an EndpointSlice's
//! time on what such documents never hold (anchors, tags, multi-line
//! scalars, the events and spans of each node). This reader takes the
//! common shape only and refuses anything else, so that the general path
//! reads it (and names any problem); whatever it accepts, it reads as the
//! general path does:
//!
//! * Block structure: block mappings (`key: value`, plain keys of letters,
//!   digits and `._/-`, starting with a letter), block sequences (`- `,
//!   also at the indentation of the key that holds them), comments and
//!   blank lines, one leading `---`.
//! * Flow structure, as a value in the block structure or as the whole
//!   document: flow sequences (`[a, b]`) and flow mappings (`{a: b}`,
//!   keys plain as above or quoted, each followed by `: `), one inside
//!   another, a `,` allowed after the last entry, empty ones (`[]`, `{}`).
//!   A flow collection may go on over the lines below, at any indentation
//!   (as the general parser takes them), with comments and blank lines;
//!   the rest of its last line holds nothing but a comment.
//! * A key given twice, in either structure, is refused (the general path
//!   rejects it).
//! * Scalars, on one line: plain, single-quoted without `''`,
//!   double-quoted without escapes (quoted ones may hold anything else,
//!   `,` `}` `:` `#` included). In a flow collection a plain scalar ends at
//!   `,`, a bracket, a `:` followed by a space, a comment or the end of
//!   the line. A plain scalar is typed as the general parser types it when
//!   that is certain: `null`, `Null`, `NULL`, `~` and nothing are null;
//!   `true`/`false` (and `True`, `TRUE`, ...) booleans; decimal integers
//!   without leading zeros numbers; a scalar that starts with a letter and
//!   is no YAML 1.1 boolean or null a string, as are dotted IPv4 addresses
//!   and IPv6 addresses. Any other plain scalar is refused (it might be a
//!   number the general parser reads differently).
//! * Refused: tabs, carriage returns, a byte-order mark, anchors, aliases,
//!   tags, block scalars (`|`, `>`), continuation lines (of a plain or a
//!   quoted scalar, in either structure), complex keys (`?`), merge keys,
//!   empty values and single pairs (`[a: b]`) in flow collections,
//!   directives, content on the `---` line, and collections more than
//!   [`MAX_DEPTH`] deep.
//!
//! Any error, whether the reader's or the target type's, is just "not
//! here" ([`decode`] gives `None`): the caller takes the general path.

use std::fmt;

use serde::de::{self, Deserialize, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// `text` (one YAML document) as `T`, when it has the shape this reader
/// takes and `T` accepts it; else `None`.
pub(super) fn decode<'a, T: Deserialize<'a>>(text: &'a str) -> Option<T> {
    TOKENS.with(|tokens| {
        let mut tokens = tokens.take();
        tokens.clear();
        let parsed = Parser::new(text, &mut tokens).document().ok();
        let decoded = parsed.and_then(|()| {
            let mut de = De {
                text,
                tokens: &tokens,
                at: 0,
            };
            T::deserialize(&mut de).ok()
        });
        // Keep the buffer for the next document, unless one odd document
        // made it large.
        if tokens.capacity() <= KEEP_TOKENS {
            TOKENS.with(|cell| cell.set(tokens));
        }
        decoded
    })
}

/// The most tokens a thread keeps room for between documents.
const KEEP_TOKENS: usize = 4096;

thread_local! {
    /// Each thread's token buffer, reused from document to document.
    static TOKENS: std::cell::Cell<Vec<Token>> = const { std::cell::Cell::new(Vec::new()) };
}

/// One node, in document order; a collection is followed by its contents
/// (a mapping's as key, value, key, value...) and says where they end.
/// Scalars are byte ranges of the text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token {
    /// `len`: entries (for a sequence, the size hint its reader gets).
    Map {
        end: u32,
        len: u32,
    },
    Seq {
        end: u32,
        len: u32,
    },
    Null,
    Bool(bool),
    Int {
        start: u32,
        end: u32,
    },
    Str {
        start: u32,
        end: u32,
    },
}

/// The document does not have the shape this reader takes (or `T` refused
/// it): the general path decides.
#[derive(Debug)]
pub(super) struct NotHere;

impl fmt::Display for NotHere {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not the usual shape")
    }
}

impl std::error::Error for NotHere {}

impl de::Error for NotHere {
    fn custom<T: fmt::Display>(_: T) -> Self {
        NotHere
    }
}

type Result<T> = std::result::Result<T, NotHere>;

/// The rest of a line from a column on: `start..end` of the text (without
/// the line break), at `column`.
#[derive(Clone, Copy, Debug)]
struct Line {
    column: usize,
    start: usize,
    end: usize,
}

struct Parser<'a, 't> {
    text: &'a str,
    bytes: &'a [u8],
    tokens: &'t mut Vec<Token>,
    /// Where the next line starts.
    next: usize,
    /// The line being read (`None`: the end of the document).
    line: Option<Line>,
    /// Collections open around the node being read.
    depth: usize,
}

/// The most collections one inside another this reader takes (a deeper
/// document goes to the general path, which has its own limit).
const MAX_DEPTH: usize = 64;

/// Can `b` be in a plain key?
fn key_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'/' | b'-' | b'_')
}

/// Words a YAML 1.1 parser reads as booleans or null, in any case.
fn special_word(word: &str) -> bool {
    word.len() <= 8
        && [
            "y", "n", "yes", "no", "on", "off", "true", "false", "null", "inf", "nan", "infinity",
        ]
        .iter()
        .any(|w| w.eq_ignore_ascii_case(word))
}

/// A plain scalar typed as the general parser types it, or refused.
fn plain(s: &str, start: usize) -> Result<Token> {
    let bytes = s.as_bytes();
    let Some(&first) = bytes.first() else {
        return Ok(Token::Null);
    };
    let range = Token::Str {
        start: start as u32,
        end: (start + s.len()) as u32,
    };
    if first.is_ascii_alphabetic() {
        if bytes.len() > 8 {
            return Ok(range);
        }
        return match s {
            "null" | "Null" | "NULL" => Ok(Token::Null),
            "true" | "True" | "TRUE" => Ok(Token::Bool(true)),
            "false" | "False" | "FALSE" => Ok(Token::Bool(false)),
            _ if special_word(s) => Err(NotHere),
            _ => Ok(range),
        };
    }
    if s == "~" {
        return Ok(Token::Null);
    }
    let digits = bytes.strip_prefix(b"-").unwrap_or(bytes);
    let integer = match digits {
        [b'0'] => bytes.len() == 1,
        [b'1'..=b'9', rest @ ..] => rest.len() < 18 && rest.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    if integer {
        return Ok(Token::Int {
            start: start as u32,
            end: (start + s.len()) as u32,
        });
    }
    if !first.is_ascii_digit() {
        return Err(NotHere);
    }
    // No number has two dots, nor a colon next to a hex letter or another
    // colon.
    let (mut dots, mut colons, mut letters) = (0, 0, 0);
    for &b in bytes {
        match b {
            b'0'..=b'9' => {}
            b'.' => dots += 1,
            b':' => colons += 1,
            b'a'..=b'f' | b'A'..=b'F' => letters += 1,
            _ => return Err(NotHere),
        }
    }
    let ipv4 = colons == 0 && letters == 0 && dots >= 2;
    let ipv6 = colons > 0 && (letters > 0 || s.contains("::"));
    if ipv4 || ipv6 {
        Ok(range)
    } else {
        Err(NotHere)
    }
}

impl<'a, 't> Parser<'a, 't> {
    fn new(text: &'a str, tokens: &'t mut Vec<Token>) -> Self {
        Parser {
            text,
            bytes: text.as_bytes(),
            tokens,
            next: 0,
            line: None,
            depth: 0,
        }
    }

    /// Enters a collection: refused past [`MAX_DEPTH`].
    fn enter(&mut self) -> Result<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(NotHere);
        }
        Ok(())
    }

    fn document(mut self) -> Result<()> {
        if self.text.len() >= u32::MAX as usize
            || self.bytes.iter().any(|&b| b == b'\t' || b == b'\r')
            || self.text.starts_with('\u{feff}')
        {
            return Err(NotHere);
        }
        self.advance()?;
        // A leading `---`, with nothing but a comment after it.
        if let Some(line) = self.line {
            let content = &self.text[line.start..line.end];
            if line.column == 0 && content.starts_with("---") {
                if !self.rest_is_empty(line.start + 3) {
                    return Err(NotHere);
                }
                self.advance()?;
            }
        }
        let Some(line) = self.line else {
            return Err(NotHere); // an empty document: the general path skips it
        };
        if self.bytes[line.start] == b'{' {
            self.flow_value(line.start)?;
            self.advance()?;
        } else if self.entry_key(line).is_some() {
            self.map(line.column)?;
        } else {
            return Err(NotHere);
        }
        if self.line.is_some() {
            return Err(NotHere);
        }
        Ok(())
    }

    /// Moves to the next line with content (not blank, not only a comment).
    fn advance(&mut self) -> Result<()> {
        while self.next < self.bytes.len() {
            let start = self.next;
            // Lines are short: a plain loop beats a search's set-up.
            let column = self.bytes[start..]
                .iter()
                .take_while(|b| **b == b' ')
                .count();
            let content = start + column;
            let end = self.bytes[content..]
                .iter()
                .position(|b| *b == b'\n')
                .map_or(self.bytes.len(), |i| content + i);
            self.next = (end + 1).min(self.bytes.len());
            if content == end || self.bytes[content] == b'#' {
                continue;
            }
            if column == 0
                && (self.text[content..end].starts_with("...")
                    || (self.text[content..end].starts_with("---") && start > 0)
                    || self.bytes[content] == b'%')
            {
                return Err(NotHere);
            }
            self.line = Some(Line {
                column,
                start: content,
                end,
            });
            return Ok(());
        }
        self.line = None;
        Ok(())
    }

    /// Whether the line has nothing from `at` on but spaces and a comment.
    fn rest_is_empty(&self, at: usize) -> bool {
        let end = self.line.map_or(at, |l| l.end);
        let rest = &self.text[at.min(end)..end];
        let trimmed = rest.trim_start_matches(' ');
        trimmed.is_empty() || (trimmed.starts_with('#') && trimmed.len() < rest.len())
    }

    /// When `line` starts with a mapping entry: the key's end (the colon).
    fn entry_key(&self, line: Line) -> Option<usize> {
        let bytes = &self.bytes[line.start..line.end];
        if !bytes.first()?.is_ascii_alphabetic() {
            return None;
        }
        let len = bytes.iter().take_while(|b| key_byte(**b)).count();
        if bytes.get(len) != Some(&b':') || !matches!(bytes.get(len + 1), None | Some(b' ')) {
            return None;
        }
        Some(line.start + len)
    }

    fn push(&mut self, token: Token) -> usize {
        self.tokens.push(token);
        self.tokens.len() - 1
    }

    /// Where the node at token `at` ends.
    fn skip(tokens: &[Token], at: usize) -> usize {
        match tokens[at] {
            Token::Map { end, .. } | Token::Seq { end, .. } => end as usize,
            _ => at + 1,
        }
    }

    /// A block mapping whose keys are at `column`, from the current line.
    fn map(&mut self, column: usize) -> Result<()> {
        self.enter()?;
        let map = self.push(Token::Map { end: 0, len: 0 });
        let mut len = 0;
        while let Some(line) = self.line {
            if line.column < column {
                break;
            }
            if line.column > column {
                return Err(NotHere);
            }
            let colon = self.entry_key(line).ok_or(NotHere)?;
            let key = Token::Str {
                start: line.start as u32,
                end: colon as u32,
            };
            self.check_new_key(map, &self.text[line.start..colon])?;
            self.push(key);
            len += 1;
            if self.rest_is_empty(colon + 1) {
                self.advance()?;
                self.block_value(column)?;
            } else {
                let at = colon
                    + 1
                    + self.bytes[colon + 1..line.end]
                        .iter()
                        .take_while(|b| **b == b' ')
                        .count();
                self.scalar(Line {
                    column: column + (at - line.start),
                    start: at,
                    end: line.end,
                })?;
                self.advance()?;
            }
        }
        self.tokens[map] = Token::Map {
            end: self.tokens.len() as u32,
            len,
        };
        self.depth -= 1;
        Ok(())
    }

    /// Refuses `key` when the mapping starting at token `map` has it already.
    fn check_new_key(&self, map: usize, key: &str) -> Result<()> {
        if key.len() <= 5 && special_word(key) {
            return Err(NotHere);
        }
        let (len, first) = (key.len() as u32, key.as_bytes()[0]);
        let mut at = map + 1;
        while at < self.tokens.len() {
            if let Token::Str { start, end } = self.tokens[at] {
                if end - start == len
                    && self.bytes[start as usize] == first
                    && &self.text[start as usize..end as usize] == key
                {
                    return Err(NotHere);
                }
            }
            at = Self::skip(self.tokens, at + 1);
        }
        Ok(())
    }

    /// The value of a key at `column` whose line ends after the colon: a
    /// block node on the lines below, or null.
    fn block_value(&mut self, column: usize) -> Result<()> {
        match self.line {
            Some(line) if line.column > column => self.node(line),
            Some(line) if line.column == column && self.dash(line) => self.seq(column),
            _ => {
                self.push(Token::Null);
                Ok(())
            }
        }
    }

    /// Whether `line` starts with a sequence entry's `-`.
    fn dash(&self, line: Line) -> bool {
        self.bytes[line.start] == b'-'
            && (line.start + 1 == line.end || self.bytes[line.start + 1] == b' ')
    }

    /// The node starting at `line` (the current line, or the rest of it
    /// after a `- `): a sequence, a mapping, or a scalar or flow collection.
    fn node(&mut self, line: Line) -> Result<()> {
        if self.dash(line) {
            self.seq(line.column)
        } else if self.entry_key(line).is_some() {
            self.map(line.column)
        } else {
            self.scalar(line)?;
            self.advance()
        }
    }

    /// A block sequence whose `-` are at `column`, from the current line.
    fn seq(&mut self, column: usize) -> Result<()> {
        self.enter()?;
        let seq = self.push(Token::Seq { end: 0, len: 0 });
        let mut len = 0;
        while let Some(line) = self.line {
            if line.column < column || (line.column == column && !self.dash(line)) {
                break;
            }
            if line.column > column {
                return Err(NotHere);
            }
            len += 1;
            if self.rest_is_empty(line.start + 1) {
                self.advance()?;
                match self.line {
                    Some(next) if next.column > column => self.node(next)?,
                    _ => {
                        self.push(Token::Null);
                    }
                }
                continue;
            }
            let spaces = self.bytes[line.start + 1..line.end]
                .iter()
                .take_while(|b| **b == b' ')
                .count();
            let rest = Line {
                column: column + 1 + spaces,
                start: line.start + 1 + spaces,
                end: line.end,
            };
            self.line = Some(rest);
            self.node(rest)?;
        }
        self.tokens[seq] = Token::Seq {
            end: self.tokens.len() as u32,
            len,
        };
        self.depth -= 1;
        Ok(())
    }

    /// A scalar or a flow collection filling the rest of `line`, but for a
    /// comment (a flow collection may go on over the lines below).
    fn scalar(&mut self, line: Line) -> Result<()> {
        let bytes = &self.bytes[line.start..line.end];
        let (token, after) = match bytes[0] {
            b'"' | b'\'' => self.quoted(line.start, line.end)?,
            b'[' | b'{' => return self.flow_value(line.start),
            b'-' if bytes.get(1).is_some_and(u8::is_ascii_digit) => self.plain(line)?,
            b'-' | b'?' | b':' | b',' | b']' | b'}' | b'#' | b'&' | b'*' | b'!' | b'|' | b'>'
            | b'%' | b'@' | b'`' => return Err(NotHere),
            _ => self.plain(line)?,
        };
        if !self.only_comment(after, line.end) {
            return Err(NotHere);
        }
        self.push(token);
        Ok(())
    }

    /// Whether `at..end` (the rest of a line) holds nothing but spaces and
    /// a comment.
    fn only_comment(&self, at: usize, end: usize) -> bool {
        let rest = &self.bytes[at.min(end)..end];
        let spaces = rest.iter().take_while(|b| **b == b' ').count();
        spaces == rest.len() || (rest[spaces] == b'#' && spaces > 0)
    }

    /// A quoted scalar from `at` that closes before `end` (on its line):
    /// the string, and where it ends. Escapes (`\`, `''`) are refused:
    /// the string is the text between the quotes.
    fn quoted(&self, at: usize, end: usize) -> Result<(Token, usize)> {
        let quote = self.bytes[at];
        let bytes = &self.bytes[at + 1..end];
        let len = bytes.iter().position(|b| *b == quote).ok_or(NotHere)?;
        if quote == b'"' && bytes[..len].contains(&b'\\') {
            return Err(NotHere);
        }
        if bytes.get(len + 1) == Some(&quote) {
            return Err(NotHere); // '' inside single quotes
        }
        let start = at + 1;
        let token = Token::Str {
            start: start as u32,
            end: (start + len) as u32,
        };
        Ok((token, start + len + 1))
    }

    /// Where the line holding `at` ends (its line break, or the end of
    /// the text).
    fn line_end(&self, at: usize) -> usize {
        self.bytes[at..]
            .iter()
            .position(|b| *b == b'\n')
            .map_or(self.bytes.len(), |i| at + i)
    }

    /// A flow collection from its `[` or `{` at `at`, which may go on over
    /// the lines below; the rest of its last line holds nothing but a
    /// comment. The next line read is the one after it.
    fn flow_value(&mut self, at: usize) -> Result<()> {
        let mut pos = at;
        self.flow(&mut pos)?;
        let end = self.line_end(pos);
        if !self.only_comment(pos, end) {
            return Err(NotHere);
        }
        self.next = (end + 1).min(self.bytes.len());
        Ok(())
    }

    /// A flow sequence or mapping from its `[` or `{` at `pos`, to just
    /// after its `]` or `}`. Entries are separated by `,` (one may follow
    /// the last); a mapping's entries are `key: value`, a plain key of
    /// [`key_byte`]s or a quoted one, and a value.
    fn flow(&mut self, pos: &mut usize) -> Result<()> {
        self.enter()?;
        let map = self.bytes[*pos] == b'{';
        let close = if map { b'}' } else { b']' };
        let at = self.push(Token::Null);
        *pos += 1;
        let mut len = 0;
        loop {
            self.gap(pos)?;
            if self.bytes[*pos] == close {
                break;
            }
            if map {
                self.flow_key(pos, at)?;
                self.gap(pos)?;
                if matches!(self.bytes[*pos], b',' | b'}') {
                    return Err(NotHere); // an empty value
                }
            }
            self.flow_node(pos)?;
            len += 1;
            self.gap(pos)?;
            match self.bytes[*pos] {
                b',' => *pos += 1,
                b if b == close => break,
                _ => return Err(NotHere),
            }
        }
        *pos += 1;
        let end = self.tokens.len() as u32;
        self.tokens[at] = if map {
            Token::Map { end, len }
        } else {
            Token::Seq { end, len }
        };
        self.depth -= 1;
        Ok(())
    }

    /// Moves `pos` over spaces, line breaks and comments inside a flow
    /// collection, to its next content. Indentation does not count there
    /// (the general parser takes a line at any column), but a line must be
    /// no document marker or directive; the document must not end inside
    /// the collection.
    fn gap(&self, pos: &mut usize) -> Result<()> {
        let bytes = self.bytes;
        // After a space or a line break, `#` starts a comment.
        let mut spaced = false;
        loop {
            match bytes.get(*pos) {
                None => return Err(NotHere),
                Some(b' ') => {
                    *pos += 1;
                    spaced = true;
                }
                Some(b'#') if spaced => *pos = self.line_end(*pos),
                Some(b'\n') => {
                    let start = *pos + 1;
                    let column = bytes[start..].iter().take_while(|b| **b == b' ').count();
                    let content = start + column;
                    let rest = &self.text[content..];
                    let blank = rest.is_empty() || rest.starts_with(['\n', '#']);
                    if !blank
                        && column == 0
                        && (rest.starts_with("---")
                            || rest.starts_with("...")
                            || rest.starts_with('%'))
                    {
                        return Err(NotHere);
                    }
                    *pos = content;
                    spaced = true;
                }
                Some(_) => return Ok(()),
            }
        }
    }

    /// A flow mapping's key at `pos` and its `:` (followed by a space or a
    /// line break), for the mapping at token `map`; `pos` ends after the `:`.
    fn flow_key(&mut self, pos: &mut usize, map: usize) -> Result<()> {
        let at = *pos;
        let (token, after) = match self.bytes[at] {
            b'"' | b'\'' => self.quoted(at, self.line_end(at))?,
            b if b.is_ascii_alphabetic() => {
                let len = self.bytes[at..]
                    .iter()
                    .take_while(|b| key_byte(**b))
                    .count();
                let token = Token::Str {
                    start: at as u32,
                    end: (at + len) as u32,
                };
                (token, at + len)
            }
            _ => return Err(NotHere),
        };
        let Token::Str { start, end } = token else {
            return Err(NotHere);
        };
        let key = &self.text[start as usize..end as usize];
        if key.is_empty() || key == "<<" {
            return Err(NotHere);
        }
        if self.bytes.get(after) != Some(&b':')
            || !matches!(self.bytes.get(after + 1), Some(b' ' | b'\n'))
        {
            return Err(NotHere);
        }
        self.check_new_key(map, key)?;
        self.push(token);
        *pos = after + 1;
        Ok(())
    }

    /// A node inside a flow collection, at `pos`: a flow collection, a
    /// quoted scalar (on one line) or a plain one (on one line, to a `,`,
    /// a bracket, a `: `, a comment or the line's end).
    fn flow_node(&mut self, pos: &mut usize) -> Result<()> {
        let at = *pos;
        let bytes = self.bytes;
        match bytes[at] {
            b'[' | b'{' => return self.flow(pos),
            b'"' | b'\'' => {
                let (token, after) = self.quoted(at, self.line_end(at))?;
                self.push(token);
                *pos = after;
                return Ok(());
            }
            b'-' if bytes.get(at + 1).is_some_and(u8::is_ascii_digit) => {}
            b'-' | b'?' | b':' | b',' | b']' | b'}' | b'#' | b'&' | b'*' | b'!' | b'|' | b'>'
            | b'%' | b'@' | b'`' => return Err(NotHere),
            _ => {}
        }
        let mut end = at;
        for (i, &b) in bytes.iter().enumerate().skip(at) {
            match b {
                b'\n' | b',' | b'[' | b']' | b'{' | b'}' => break,
                b'#' if bytes[i - 1] == b' ' => break,
                b':' if matches!(
                    bytes.get(i + 1),
                    None | Some(b' ' | b'\n' | b',' | b'[' | b']' | b'{' | b'}')
                ) =>
                {
                    break
                }
                b' ' => {}
                _ => end = i + 1,
            }
        }
        let token = plain(&self.text[at..end], at)?;
        self.push(token);
        *pos = end;
        Ok(())
    }

    /// A plain scalar: to a comment or the end of the line.
    fn plain(&self, line: Line) -> Result<(Token, usize)> {
        let bytes = &self.bytes[line.start..line.end];
        let mut end = bytes.len();
        for (i, &b) in bytes.iter().enumerate() {
            match b {
                b'#' if i > 0 && bytes[i - 1] == b' ' => {
                    end = i;
                    break;
                }
                b':' if matches!(bytes.get(i + 1), None | Some(b' ')) => return Err(NotHere),
                _ => {}
            }
        }
        let value = self.text[line.start..line.start + end].trim_end_matches(' ');
        Ok((plain(value, line.start)?, line.end))
    }
}

/// Hands the tokens to a [`Deserialize`] type.
struct De<'a, 't> {
    text: &'a str,
    tokens: &'t [Token],
    at: usize,
}

impl<'a, 't> De<'a, 't> {
    fn next(&mut self) -> Result<Token> {
        let token = *self.tokens.get(self.at).ok_or(NotHere)?;
        self.at += 1;
        Ok(token)
    }

    /// The contents of the collection just read: `len` entries to `end`.
    fn entries(&mut self, end: u32, len: u32) -> Entries<'_, 'a, 't> {
        Entries {
            de: self,
            end: end as usize,
            len,
        }
    }

    /// `value`, when its visitor read the collection to its `end`.
    fn ended<T>(&self, end: u32, value: T) -> Result<T> {
        if self.at == end as usize {
            Ok(value)
        } else {
            Err(NotHere)
        }
    }
}

impl<'de> Deserializer<'de> for &mut De<'de, '_> {
    type Error = NotHere;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.next()? {
            Token::Null => visitor.visit_unit(),
            Token::Bool(b) => visitor.visit_bool(b),
            Token::Int { start, end } => {
                let s = &self.text[start as usize..end as usize];
                match s.strip_prefix('-') {
                    Some(_) => visitor.visit_i64(s.parse().map_err(|_| NotHere)?),
                    None => visitor.visit_u64(s.parse().map_err(|_| NotHere)?),
                }
            }
            Token::Str { start, end } => {
                visitor.visit_borrowed_str(&self.text[start as usize..end as usize])
            }
            Token::Map { end, len } => {
                let value = visitor.visit_map(self.entries(end, len))?;
                self.ended(end, value)
            }
            Token::Seq { end, len } => {
                let value = visitor.visit_seq(self.entries(end, len))?;
                self.ended(end, value)
            }
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        if self.tokens.get(self.at) == Some(&Token::Null) {
            self.at += 1;
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        if self.at >= self.tokens.len() {
            return Err(NotHere);
        }
        self.at = Parser::skip(self.tokens, self.at);
        visitor.visit_unit()
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value> {
        Err(NotHere)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map struct
        identifier
    }
}

/// A collection's contents, to token `end`: `len` entries.
struct Entries<'d, 'a, 't> {
    de: &'d mut De<'a, 't>,
    end: usize,
    len: u32,
}

impl<'de> Entries<'_, 'de, '_> {
    /// The next entry (a key, or an element) through `seed`; `None` at the end.
    fn next<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<Option<S::Value>> {
        if self.de.at >= self.end {
            return Ok(None);
        }
        seed.deserialize(&mut *self.de).map(Some)
    }
}

impl<'de> MapAccess<'de> for Entries<'_, 'de, '_> {
    type Error = NotHere;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>> {
        self.next(seed)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value> {
        seed.deserialize(&mut *self.de)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.len as usize)
    }
}

impl<'de> SeqAccess<'de> for Entries<'_, 'de, '_> {
    type Error = NotHere;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>> {
        self.next(seed)
    }

    fn size_hint(&self) -> Option<usize> {
        Some(self.len as usize)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::source::dir::parse::{parse_as, parse_document, parse_each, yaml_documents, Inputs};
    use crate::source::wire::DocInfo;

    /// What the general path reads from `doc`: the Service or the slice,
    /// or the error's text.
    fn general(doc: &str) -> std::result::Result<String, String> {
        parse_as::<Inputs>(Path::new("a.yaml"), doc.as_bytes())
            .map(|o| format!("{:?}{:?}", o.services, o.endpoint_slices))
            .map_err(|e| e.to_string())
    }

    fn block(doc: &str) -> Option<String> {
        decode::<DocInfo>(doc).map(|d| match d {
            DocInfo::Service(svc) => format!("{:?}{:?}", [svc], [(); 0]),
            DocInfo::Slice(slice) => format!("{:?}{:?}", [(); 0], [slice]),
            DocInfo::Other => "other".into(),
        })
    }

    const SERVICE: &str = "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: shop\n  labels:\n    app: web\n  annotations:\n    switchboard.io/lb-algorithm: maglev\nspec:\n  type: ClusterIP\n  clusterIP: 10.96.0.10\n  clusterIPs:\n  - 10.96.0.10\n  - fd00:96::10\n  ipFamilies:\n  - IPv4\n  - IPv6\n  selector:\n    app: web\n  ports:\n  - name: http\n    port: 80\n    protocol: TCP\n    targetPort: 8080\n  - name: dns\n    port: 53\n    protocol: UDP\n";

    const SLICE: &str = "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\naddressType: IPv4\nmetadata:\n  name: web-abcde\n  namespace: shop\n  labels:\n    kubernetes.io/service-name: web\nendpoints:\n- addresses:\n  - 10.244.1.2\n  conditions:\n    ready: true\n    serving: true\n    terminating: false\n  nodeName: node-a\n- addresses:\n    - 10.244.1.3\n    - 10.244.1.4\n  conditions: {}\n  hints:\n    forZones:\n    - name: zone-1\nports:\n- name: http\n  port: 8080\n  protocol: TCP\n";

    /// The usual shapes are read here, and as the general path reads them.
    #[test]
    fn the_usual_shapes_read_as_the_general_path_reads_them() {
        let variants = [
            SERVICE.to_string(),
            SLICE.to_string(),
            // Comments, blank lines, quotes, a sequence indented under its
            // key, an empty value, null and `[]`.
            "--- # a Service\n# about it\napiVersion: \"v1\"\nkind: 'Service'\n\nmetadata:\n  name: web   # its name\n  namespace:\nspec:\n  externalIPs: []\n  clusterIP: ~\n  ports:\n    - port: 80\n      nodePort: 30080\n      name: 'http'\n  sessionAffinity: ClientIP\n  sessionAffinityConfig:\n    clientIP:\n      timeoutSeconds: 600\n".to_string(),
            SLICE.replace("  nodeName: node-a\n", "  nodeName: null\n"),
            SLICE.replace("endpoints:\n", "endpoints: []\nx:\n"),
            SERVICE.replace("  labels:\n    app: web\n", "  labels: {}\n"),
            SERVICE.replace("    port: 80\n", "    port: -1\n"),
            // An unused key with a value of any shape.
            SERVICE.replace("  selector:\n", "  other:\n  - - a\n    - b\n  -\n  - c: []\n  selector:\n"),
        ];
        for doc in &variants {
            let read = block(doc);
            assert!(read.is_some(), "read here: {doc}");
            assert_eq!(read.ok_or_else(String::new), general(doc), "{doc}");
        }
        let other = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\ndata:\n  a: b\n";
        assert_eq!(block(other).as_deref(), Some("other"));
    }

    /// Whatever might read otherwise is left to the general path, which
    /// gives its own result or error.
    #[test]
    fn anything_else_is_left_to_the_general_path() {
        let refused = [
            // Scalars the general parser types otherwise, or might.
            SERVICE.replace("name: web\n", "name: 0123\n"),
            SERVICE.replace("name: web\n", "name: yes\n"),
            SERVICE.replace("name: web\n", "name: 1e3\n"),
            SERVICE.replace("name: web\n", "name: .inf\n"),
            SERVICE.replace("name: web\n", "name: 12:30\n"),
            SERVICE.replace("name: web\n", "name: -web\n"),
            SERVICE.replace("port: 80\n", "port: '80'\n"),
            SERVICE.replace("port: 80\n", "port: 8_0\n"),
            SERVICE.replace("port: 80\n", "port: 0x50\n"),
            SERVICE.replace("port: 80\n", "port: 99999999999\n"),
            // Keys given twice, at any depth.
            SERVICE.replace("  name: web\n", "  name: web\n  name: web2\n"),
            SERVICE.replace("    app: web\n", "    app: web\n    app: x\n"),
            // Shapes left to the general parser.
            SERVICE.replace("name: web\n", "name: &a web\n"),
            SERVICE.replace("name: web\n", "name: !!str web\n"),
            SERVICE.replace("name: web\n", "name: |\n    web\n"),
            SERVICE.replace("name: web\n", "name: web\n    continued\n"),
            SERVICE.replace("name: web\n", "name: 'it''s'\n"),
            SERVICE.replace("name: web\n", "name: \"w\\x65b\"\n"),
            SERVICE.replace("name: web\n", "name: \"web\n"),
            SERVICE.replace("name: web\n", "name: web: x\n"),
            SERVICE.replace("name: web\n", "name:\tweb\n"),
            SERVICE.replace("\n", "\r\n"),
            SERVICE.replace("  type: ClusterIP\n", "  <<: {type: ClusterIP}\n"),
            SERVICE.replace("  type: ClusterIP\n", "  ? type\n  : ClusterIP\n"),
            SERVICE.replace("  type: ClusterIP\n", "   type: ClusterIP\n"),
            SERVICE.replace("---\n", "--- {a: b}\n"),
            SERVICE.replace("  name: web\n", "  'name': web\n"),
            SERVICE.replace("    app: web\n", "    on: web\n"),
            "apiVersion: v1\nkind: Service\nspec: x\n- a\n".to_string(),
            "# nothing\n".to_string(),
            "- a\n".to_string(),
        ];
        for doc in &refused {
            assert_eq!(block(doc), None, "{doc}");
        }
    }

    /// One case file (see [`cases_read_as_they_say`]): its documents'
    /// expected reads, then the file's expected error, if any.
    struct Case {
        input: String,
        documents: Vec<Expected>,
        error: Option<String>,
    }

    #[derive(Debug)]
    enum Expected {
        /// Read here as this value (and by the general parser too).
        Fast(serde_json::Value),
        /// Left to the general path, which reads this value.
        General(serde_json::Value),
        /// Nothing in it (left to the general path, which skips it).
        Empty,
    }

    /// The case file `text`: comment lines, then `=== in` and the file's
    /// text, then `=== out` and one entry per document, each a line
    /// starting with `fast`, `general` (each followed by the document as
    /// JSON, which may go on over lines starting with a space) or `empty`,
    /// and last, for a file that does not parse, `error` and its message.
    fn case(text: &str) -> std::result::Result<Case, String> {
        let (head, out) = text.split_once("=== out\n").ok_or("no `=== out` line")?;
        let (_, input) = head.split_once("=== in\n").ok_or("no `=== in` line")?;
        let mut entries: Vec<String> = Vec::new();
        for line in out.lines() {
            match (line.strip_prefix(' '), entries.last_mut()) {
                (Some(more), Some(entry)) => entry.push_str(more),
                _ if line.is_empty() => {}
                _ => entries.push(line.to_string()),
            }
        }
        let mut case = Case {
            input: input.to_string(),
            documents: Vec::new(),
            error: None,
        };
        for entry in entries {
            if case.error.is_some() {
                return Err("an entry after `error`".into());
            }
            let (word, rest) = entry.split_once(' ').unwrap_or((&entry, ""));
            let json = || serde_json::from_str(rest).map_err(|e| format!("`{entry}`: {e}"));
            match word {
                "fast" => case.documents.push(Expected::Fast(json()?)),
                "general" => case.documents.push(Expected::General(json()?)),
                "empty" => case.documents.push(Expected::Empty),
                "error" => case.error = Some(rest.to_string()),
                _ => return Err(format!("unknown entry `{entry}`")),
            }
        }
        Ok(case)
    }

    /// What the general YAML parser (the directory source's options)
    /// reads from one document: its value, none for an empty one, or the
    /// error.
    fn general_values(doc: &str) -> std::result::Result<Vec<serde_json::Value>, String> {
        let mut reader = doc.as_bytes();
        let options = crate::source::dir::parse::yaml_options(doc.len());
        serde_saphyr::read_with_options::<_, serde_json::Value>(&mut reader, options)
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| e.to_string())
    }

    /// The file's objects as the directory source reads them (each
    /// document on its own, the whole file again after an error), or the
    /// error's message.
    fn as_the_source_reads(path: &Path, input: &str) -> std::result::Result<String, String> {
        let documents = yaml_documents(path, input.as_bytes()).ok_or("not split")?;
        let mut objects = Vec::new();
        for parsed in parse_each::<Inputs>(path, &documents) {
            match parsed {
                Ok(o) => objects.push(format!("{:?}{:?}", o.services, o.endpoint_slices)),
                Err(_) => {
                    let whole = parse_as::<Inputs>(path, input.as_bytes());
                    return Err(whole.map_or_else(|e| e.to_string(), |_| "parsed whole".into()));
                }
            }
        }
        Ok(objects.concat())
    }

    /// What one case file says of its documents, or what is wrong.
    fn check_case(path: &Path, case: &Case) -> std::result::Result<(), String> {
        let documents = yaml_documents(path, case.input.as_bytes()).ok_or("not split")?;
        let broken = case.error.is_some().then_some(case.documents.len());
        // A broken file has entries for the documents before the broken one.
        let counted = match broken {
            Some(at) => documents.len() > at,
            None => documents.len() == case.documents.len(),
        };
        if !counted {
            return Err(format!(
                "{} documents, {} entries",
                documents.len(),
                case.documents.len()
            ));
        }
        for (i, doc) in documents.iter().enumerate() {
            let n = i + 1;
            let fast = decode::<serde_json::Value>(doc);
            let general = general_values(doc);
            // Whatever is read here, the general parser reads the same.
            if let Some(value) = &fast {
                if general.as_ref() != Ok(&vec![value.clone()]) {
                    return Err(format!(
                        "document {n}: read here as {value}, by the general parser as {general:?}"
                    ));
                }
            }
            // A Service or a slice read here is the one the general path reads.
            if let Some(DocInfo::Service(_) | DocInfo::Slice(_)) = decode::<DocInfo>(doc) {
                let direct = parse_document::<Inputs>(path, doc).map(|o| format!("{o:?}"));
                let whole = parse_as::<Inputs>(path, doc.as_bytes()).map(|o| format!("{o:?}"));
                if direct.as_ref().map_err(ToString::to_string)
                    != whole.as_ref().map_err(ToString::to_string)
                {
                    return Err(format!(
                        "document {n}: {direct:?} here, {whole:?} generally"
                    ));
                }
            }
            let Some(expected) = case.documents.get(i) else {
                if Some(i) == broken && decode::<DocInfo>(doc).is_some() {
                    return Err(format!("document {n}: the broken one, read here"));
                }
                continue;
            };
            let ok = match expected {
                Expected::Fast(v) => fast.as_ref() == Some(v),
                Expected::General(v) => fast.is_none() && general.as_ref() == Ok(&vec![v.clone()]),
                Expected::Empty => fast.is_none() && general.as_ref().is_ok_and(Vec::is_empty),
            };
            if !ok {
                return Err(format!(
                    "document {n}: expected {expected:?}; read here: {fast:?}; by the general parser: {general:?}"
                ));
            }
        }
        let read = as_the_source_reads(path, &case.input);
        match (&case.error, read) {
            (None, Ok(_)) => Ok(()),
            (Some(want), Err(got)) if *want == got => Ok(()),
            (want, got) => Err(format!("the file: expected error {want:?}, got {got:?}")),
        }
    }

    /// The case files of `tests/fixtures/yaml-reader/`: each holds a
    /// manifest file and what each of its documents reads as (here or on
    /// the general path), or the error the file gives.
    #[test]
    fn cases_read_as_they_say() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/yaml-reader");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .expect("the case directory")
            .map(|e| e.expect("an entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "case"))
            .collect();
        files.sort();
        assert!(files.len() >= 10, "{} case files", files.len());
        let mut failed = Vec::new();
        for file in &files {
            let name = file.file_name().map(|n| n.to_string_lossy().into_owned());
            let name = name.unwrap_or_default();
            let text = std::fs::read_to_string(file).expect("a case file");
            let path = Path::new(name.trim_end_matches(".case")).with_extension("yaml");
            let result = case(&text).and_then(|c| check_case(&path, &c));
            if let Err(e) = result {
                failed.push(format!("{name}: {e}"));
            }
        }
        assert!(failed.is_empty(), "\n{}", failed.join("\n"));
    }

    #[test]
    fn tokens_of_a_small_document() {
        let mut tokens = Vec::new();
        let text = "a: x\nb:\n- 1\n- c: ''\n  d: []\ne:\n";
        Parser::new(text, &mut tokens).document().expect("read");
        let s = |start: u32, end: u32| Token::Str { start, end };
        assert_eq!(
            tokens,
            [
                Token::Map { end: 13, len: 3 },
                s(0, 1),
                s(3, 4),
                s(5, 6),
                Token::Seq { end: 11, len: 2 },
                Token::Int { start: 10, end: 11 },
                Token::Map { end: 11, len: 2 },
                s(14, 15),
                s(18, 18),
                s(22, 23),
                Token::Seq { end: 11, len: 0 },
                s(28, 29),
                Token::Null,
            ]
        );
    }
}
