//! The slash commands of `nucleus chat`'s REPL: parsing them, and the ones that only touch the
//! conversation and the request (`/set`, `/save`, `/load`, `/system`, `/clear`).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use nucleus::chat::Message;
use nucleus::engine::GenerateRequest;

pub const HELP: &str = "\
Commands:
  /help              this list
  /clear             forget the conversation (the system prompt stays)
  /system [TEXT]     set the system prompt (without TEXT: show it)
  /set [KEY VALUE]   change a sampling setting (without arguments: show them all)
                     keys: temperature (temp), top-k, top-p, min-p, typical-p,
                     repeat-penalty, repeat-last-n, presence-penalty,
                     frequency-penalty, seed (a number or `random`), max-tokens,
                     reasoning (show, hide or raw: a thinking block's printing)
  /save FILE         write the conversation as JSON messages ([{\"role\", \"content\"}])
  /load FILE         read a conversation written by /save (or any such JSON list)
  /exit              leave (also Ctrl-D)
Input: end a line with \\ to go on on the next line; a paste of several lines is one
message. Ctrl-C stops an answer (or clears the line being typed). A message that
starts with / is written //.";

/// One line typed at the prompt.
#[derive(Debug, PartialEq)]
pub enum Input {
    /// A message for the model.
    Message(String),
    Help,
    Clear,
    System(Option<String>),
    /// `/set` alone shows the settings.
    Set(Option<(String, String)>),
    Save(PathBuf),
    Load(PathBuf),
    Exit,
}

/// What a line means; an error names what is wrong with a command.
pub fn parse(line: &str) -> Result<Input> {
    let Some(rest) = line.strip_prefix('/') else {
        return Ok(Input::Message(line.to_string()));
    };
    if rest.starts_with('/') {
        return Ok(Input::Message(rest.to_string()));
    }
    let (name, arg) = match rest.split_once(char::is_whitespace) {
        Some((n, a)) => (n, a.trim()),
        None => (rest, ""),
    };
    let path = |cmd: &str| -> Result<PathBuf> {
        if arg.is_empty() {
            bail!("/{cmd} needs a file name: /{cmd} FILE");
        }
        Ok(PathBuf::from(arg))
    };
    Ok(match name {
        "help" | "?" => Input::Help,
        "clear" => Input::Clear,
        "system" => Input::System((!arg.is_empty()).then(|| arg.to_string())),
        "set" if arg.is_empty() => Input::Set(None),
        "set" => match arg.split_once(char::is_whitespace) {
            Some((k, v)) => Input::Set(Some((k.to_string(), v.trim().to_string()))),
            None => bail!("/set needs a key and a value, e.g. /set temperature 0.2"),
        },
        "save" => Input::Save(path("save")?),
        "load" => Input::Load(path("load")?),
        "exit" | "quit" | "bye" => Input::Exit,
        _ => bail!(
            "unknown command /{name} (/help lists them; a message starting with / is written //)"
        ),
    })
}

/// `/set KEY VALUE`: changes `req` only when the new value is valid (the same checks as the
/// command-line flags).
pub fn set(req: &mut GenerateRequest, key: &str, value: &str) -> Result<()> {
    let mut new = req.clone();
    let s = &mut new.sampling;
    let key = key.trim_start_matches("--").replace('_', "-");
    fn num<T: std::str::FromStr>(key: &str, v: &str) -> Result<T> {
        v.parse()
            .map_err(|_| anyhow::anyhow!("{key}: {v:?} is not a valid number"))
    }
    match key.as_str() {
        "temperature" | "temp" => s.temperature = num(&key, value)?,
        "top-k" => s.top_k = num(&key, value)?,
        "top-p" => s.top_p = num(&key, value)?,
        "min-p" => s.min_p = num(&key, value)?,
        "typical-p" => s.typical_p = num(&key, value)?,
        "repeat-penalty" => s.repeat_penalty = num(&key, value)?,
        "repeat-last-n" => s.repeat_last_n = num(&key, value)?,
        "presence-penalty" => s.presence_penalty = num(&key, value)?,
        "frequency-penalty" => s.frequency_penalty = num(&key, value)?,
        "seed" if value == "random" => s.seed = None,
        "seed" => s.seed = Some(num(&key, value)?),
        "max-tokens" => new.max_tokens = num(&key, value)?,
        _ => bail!("no setting {key:?} (/help lists them)"),
    }
    if let Err(e) = new.validate() {
        bail!("{e}");
    }
    if new.max_tokens == 0 {
        bail!("max-tokens must be at least 1");
    }
    *req = new;
    Ok(())
}

/// The settings `/set` can change, one line.
pub fn show_settings(req: &GenerateRequest) -> String {
    let s = &req.sampling;
    let seed = s.seed.map_or("random".to_string(), |v| v.to_string());
    format!(
        "temperature {} top-k {} top-p {} min-p {} typical-p {} repeat-penalty {} \
         repeat-last-n {} presence-penalty {} frequency-penalty {} seed {seed} max-tokens {}",
        s.temperature,
        s.top_k,
        s.top_p,
        s.min_p,
        s.typical_p,
        s.repeat_penalty,
        s.repeat_last_n,
        s.presence_penalty,
        s.frequency_penalty,
        req.max_tokens
    )
}

/// `/system TEXT`: the conversation's first message becomes (or is replaced by) the system
/// prompt; the rest of the conversation stays.
pub fn set_system(messages: &mut Vec<Message>, text: &str) {
    match messages.first_mut() {
        Some(m) if m.role == "system" => m.content = text.to_string(),
        _ => messages.insert(0, Message::new("system", text)),
    }
}

/// `/clear`: everything but the system prompt goes.
pub fn clear(messages: &mut Vec<Message>) {
    messages.retain(|m| m.role == "system");
    messages.truncate(1);
}

pub fn save(messages: &[Message], path: &Path) -> Result<()> {
    let json = serde_json::to_string_pretty(messages)?;
    std::fs::write(path, json + "\n").with_context(|| format!("cannot write {}", path.display()))
}

/// A conversation as `/save` writes it: a JSON list of messages with a role and a content.
pub fn load(path: &Path) -> Result<Vec<Message>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let messages: Vec<Message> = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a JSON list of messages ({{\"role\": ..., \"content\": ...}})",
            path.display()
        )
    })?;
    for (i, m) in messages.iter().enumerate() {
        if !matches!(m.role.as_str(), "system" | "user" | "assistant" | "tool") {
            bail!(
                "{}: message {i} has the role {:?} (system, user, assistant or tool)",
                path.display(),
                m.role
            );
        }
        if m.role == "system" && i > 0 {
            bail!(
                "{}: only the first message may be the system prompt",
                path.display()
            );
        }
    }
    Ok(messages)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_commands_and_messages() {
        assert_eq!(parse("hello").unwrap(), Input::Message("hello".into()));
        assert_eq!(parse("//etc").unwrap(), Input::Message("/etc".into()));
        assert_eq!(parse("/help").unwrap(), Input::Help);
        assert_eq!(parse("/system").unwrap(), Input::System(None));
        assert_eq!(
            parse("/system  Be brief. ").unwrap(),
            Input::System(Some("Be brief.".into()))
        );
        assert_eq!(
            parse("/set temp 0.2").unwrap(),
            Input::Set(Some(("temp".into(), "0.2".into())))
        );
        assert_eq!(parse("/set").unwrap(), Input::Set(None));
        assert_eq!(
            parse("/save a b.json").unwrap(),
            Input::Save("a b.json".into())
        );
        assert_eq!(parse("/exit").unwrap(), Input::Exit);
        assert!(parse("/set temp").is_err());
        assert!(parse("/load").is_err());
        let e = parse("/frobnicate").unwrap_err().to_string();
        assert!(e.contains("/frobnicate"), "{e}");
    }

    #[test]
    fn set_validates_and_keeps_the_old_value_on_error() {
        let mut req = GenerateRequest::greedy(10);
        set(&mut req, "temperature", "0.5").unwrap();
        set(&mut req, "top_k", "7").unwrap();
        set(&mut req, "--seed", "42").unwrap();
        set(&mut req, "max-tokens", "20").unwrap();
        assert_eq!(req.sampling.temperature, 0.5);
        assert_eq!(req.sampling.top_k, 7);
        assert_eq!(req.sampling.seed, Some(42));
        assert_eq!(req.max_tokens, 20);
        set(&mut req, "seed", "random").unwrap();
        assert_eq!(req.sampling.seed, None);
        assert!(set(&mut req, "top-p", "1.5").is_err());
        assert!(set(&mut req, "temperature", "hot").is_err());
        assert!(set(&mut req, "max-tokens", "0").is_err());
        assert!(set(&mut req, "colour", "1").is_err());
        assert_eq!(
            req.sampling.top_p,
            GenerateRequest::greedy(10).sampling.top_p
        );
        assert_eq!(req.max_tokens, 20);
    }

    #[test]
    fn system_clear_save_load() {
        let mut m = vec![
            Message::new("user", "hi"),
            Message::new("assistant", "hello"),
        ];
        set_system(&mut m, "Be brief.");
        set_system(&mut m, "Be very brief.");
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].content, "Be very brief.");
        let path = std::env::temp_dir().join(format!("nucleus-repl-{}.json", std::process::id()));
        save(&m, &path).unwrap();
        assert_eq!(load(&path).unwrap(), m);
        clear(&mut m);
        assert_eq!(m, vec![Message::new("system", "Be very brief.")]);
        std::fs::write(&path, r#"[{"role": "wizard", "content": "x"}]"#).unwrap();
        assert!(load(&path).unwrap_err().to_string().contains("wizard"));
        std::fs::write(&path, r#"{"role": "user"}"#).unwrap();
        assert!(load(&path).is_err());
        std::fs::remove_file(&path).unwrap();
        assert!(load(&path).is_err());
    }
}
