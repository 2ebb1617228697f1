//! `nucleus chat`. On a terminal it is a REPL: line editing and history (rustyline), slash
//! commands (`/help`, see [`repl_commands`]), multi-line input, Ctrl-C to stop an answer and a
//! speed line after each. With stdin piped it reads one message per line, as it always has:
//! an empty line or the end of the input ends the chat.

use std::io::{BufRead, IsTerminal};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use nucleus::chat::{ChatTemplate, Message};
use nucleus::engine::context::chat_keep_tokens;
use nucleus::engine::speculate::Speculator;
use nucleus::engine::{ContextPolicy, GenerateRequest, Generation, Session};
use nucleus::tokenizer::{TokenId, Tokenizer};
use rustyline::error::ReadlineError;

use crate::commands::{
    context_size, fit_prompt, load, policy_of, report_step, session_for, Loaded,
};
use crate::reasoning_print::{AnswerPrinter, ReasoningMode};
use crate::repl_commands::{self as cmds, Input};
use crate::speculate::SpeculateArgs;
use crate::{ModelArgs, SamplingArgs};

/// A conversation and what its answers need.
struct Chat<'a> {
    tokenizer: &'a Tokenizer,
    template: ChatTemplate,
    session: Session<'a>,
    speculator: Option<Speculator<'a>>,
    req: GenerateRequest,
    policy: ContextPolicy,
    n_ctx: usize,
    parse_special: bool,
    messages: Vec<Message>,
    turns: u64,
    /// `--reasoning` (and `/set reasoning`).
    reasoning: ReasoningMode,
    /// Whether stdout takes ANSI colour (a terminal, and `NO_COLOR` unset).
    color: bool,
    /// Set by Ctrl-C while an answer streams (on a terminal only).
    interrupt: Arc<AtomicBool>,
}

/// `chat`'s own flags.
pub struct ChatOptions {
    pub system: Option<String>,
    pub max_tokens: usize,
    pub parse_special_in_messages: bool,
    pub reasoning: ReasoningMode,
}

pub fn chat(
    args: ModelArgs,
    name: Option<String>,
    opts: ChatOptions,
    sampling: SamplingArgs,
    speculate: SpeculateArgs,
) -> Result<()> {
    let ChatOptions {
        system,
        max_tokens,
        parse_special_in_messages,
        reasoning,
    } = opts;
    let Loaded { model, tokenizer } = load(&args, name.as_deref())?;
    let interactive = std::io::stdin().is_terminal() && std::io::stdout().is_terminal();
    if !interactive {
        // Packed before the first reply, not in the pause after its first token.
        model.finish_packing();
    }
    std::thread::scope(|scope| {
        let req = sampling.request(max_tokens, false, model.hp.n_vocab)?;
        let method = speculate.method(req.beams)?;
        let draft = speculate.load_draft(method, args.threads)?;
        let source = tokenizer
            .chat_template()
            .ok_or(nucleus::chat::ChatError::NoTemplate)?;
        let text_of = |id: Option<TokenId>| {
            id.and_then(|i| tokenizer.token_text(i))
                .unwrap_or("")
                .to_string()
        };
        let template =
            ChatTemplate::new(source, &text_of(tokenizer.bos()), &text_of(tokenizer.eos()))?;
        let n_ctx = context_size(&args, &model)?;
        // Beams do not stream: with --beams the default stays `error`.
        let default = if req.beams > 1 {
            ContextPolicy::Error
        } else {
            ContextPolicy::Stream
        };
        let policy = policy_of(&args, default);
        let session = session_for(&args, &model, n_ctx, &req, policy)?;
        let speculator =
            speculate.speculator(method, draft.as_ref(), &tokenizer, n_ctx, args.kv_type)?;
        let mut chat = Chat {
            tokenizer: &tokenizer,
            template,
            session,
            speculator,
            req,
            policy,
            n_ctx,
            parse_special: parse_special_in_messages,
            messages: Vec::new(),
            turns: 0,
            reasoning,
            color: std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none(),
            interrupt: Arc::new(AtomicBool::new(false)),
        };
        if let Some(s) = system {
            chat.messages.push(Message::new("system", &s));
        }
        let name = model.hp.arch.name();
        if interactive {
            // Packed while the first message is typed; a reply begun before the packing
            // ends packs what it reads as it goes, with the same bits.
            scope.spawn(|| model.finish_packing());
            repl(&mut chat, name)
        } else {
            piped(&mut chat, name)
        }
    })
}

/// One message per line from a pipe; an empty line or the end ends the chat.
fn piped(chat: &mut Chat, name: &str) -> Result<()> {
    let stdin = std::io::stdin();
    eprintln!("Chatting with {name} (empty line or Ctrl-D to quit).");
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 || line.trim().is_empty() {
            return Ok(());
        }
        chat.messages.push(Message::new("user", line.trim_end()));
        let answer = chat.answer()?;
        chat.messages.push(answer);
    }
}

fn repl(chat: &mut Chat, name: &str) -> Result<()> {
    let mut editor = rustyline::DefaultEditor::new().context("cannot set up the terminal")?;
    // Ctrl-C while an answer streams sets this flag (the terminal is not in raw mode then);
    // at the prompt, rustyline reads Ctrl-C as a key.
    signal_hook::flag::register(signal_hook::consts::SIGINT, chat.interrupt.clone())
        .context("cannot handle Ctrl-C")?;
    chat.session.set_interrupt(chat.interrupt.clone());
    eprintln!("Chatting with {name}. /help lists the commands; Ctrl-D or /exit leaves.");
    while let Some(line) = read_input(&mut editor)? {
        if line.trim().is_empty() {
            continue;
        }
        let input = match cmds::parse(&line) {
            Ok(input) => input,
            Err(e) => {
                eprintln!("{e}");
                continue;
            }
        };
        match command(chat, input) {
            Ok(true) => {}
            Ok(false) => return Ok(()),
            Err(e) => eprintln!("error: {e:#}"),
        }
    }
    Ok(())
}

/// One message: lines ending with a backslash go on (the backslash dropped); a paste of
/// several lines comes as one. `None` at Ctrl-D. Ctrl-C clears what was typed.
fn read_input(editor: &mut rustyline::DefaultEditor) -> Result<Option<String>> {
    let mut text = String::new();
    loop {
        let prompt = if text.is_empty() { ">>> " } else { "... " };
        match editor.readline(prompt) {
            Ok(line) => match line.strip_suffix('\\') {
                Some(part) => {
                    text.push_str(part);
                    text.push('\n');
                }
                None => {
                    text.push_str(&line);
                    if !text.trim().is_empty() {
                        let _ = editor.add_history_entry(text.as_str());
                    }
                    return Ok(Some(text));
                }
            },
            Err(ReadlineError::Interrupted) => text.clear(),
            Err(ReadlineError::Eof) => return Ok(None),
            Err(e) => return Err(e).context("cannot read the terminal"),
        }
    }
}

/// Does what a line says; `false` to leave.
fn command(chat: &mut Chat, input: Input) -> Result<bool> {
    match input {
        Input::Message(text) => {
            chat.messages.push(Message::new("user", &text));
            match chat.answer() {
                Ok(answer) => chat.messages.push(answer),
                Err(e) => {
                    chat.messages.pop(); // the message was not answered
                    return Err(e);
                }
            }
        }
        Input::Help => eprintln!("{}", cmds::HELP),
        Input::Clear => {
            cmds::clear(&mut chat.messages);
            eprintln!("(the conversation is cleared)");
        }
        Input::System(None) => match chat.messages.first() {
            Some(m) if m.role == "system" => eprintln!("{}", m.content),
            _ => eprintln!("(no system prompt; /system TEXT sets one)"),
        },
        Input::System(Some(text)) => {
            cmds::set_system(&mut chat.messages, &text);
            eprintln!("(the system prompt is set)");
        }
        Input::Set(None) => eprintln!("{}", chat.settings()),
        Input::Set(Some((key, value))) => {
            if key.trim_start_matches("--") == "reasoning" {
                chat.reasoning = ReasoningMode::parse(&value)?;
            } else {
                cmds::set(&mut chat.req, &key, &value)?;
            }
            eprintln!("{}", chat.settings());
        }
        Input::Save(path) => {
            cmds::save(&chat.messages, &path)?;
            let n = chat.messages.len();
            eprintln!("({n} messages saved to {})", path.display());
        }
        Input::Load(path) => {
            chat.messages = cmds::load(&path)?;
            let n = chat.messages.len();
            eprintln!("({n} messages loaded from {})", path.display());
        }
        Input::Exit => return Ok(false),
    }
    Ok(true)
}

impl Chat<'_> {
    /// `/set`'s line: the sampling settings and `reasoning`.
    fn settings(&self) -> String {
        format!(
            "{} reasoning {}",
            cmds::show_settings(&self.req),
            self.reasoning.name()
        )
    }

    /// Answers the conversation so far, streaming the answer to stdout (a reasoning model's
    /// thinking apart, see [`AnswerPrinter`]); then one line of speed to stderr. Gives the
    /// assistant's message for the conversation.
    fn answer(&mut self) -> Result<Message> {
        // Only the template's own text becomes special tokens (unless
        // --parse-special-in-messages), and BOS comes once.
        let encode = |msgs: &[Message], gen: bool| -> Result<Vec<TokenId>> {
            Ok(self
                .template
                .encode(self.tokenizer, msgs, gen, self.parse_special)?)
        };
        let (tokens, opened) = self.template.encode_with_kwargs(
            self.tokenizer,
            &self.messages,
            None,
            true,
            self.parse_special,
            None,
        )?;
        // `truncate` keeps the system message (when it fits) and drops the oldest turns.
        let keep = chat_keep_tokens(&self.messages, &tokens, encode)?;
        let (tokens, _) = fit_prompt(self.policy, tokens, keep, self.n_ctx, self.req.max_tokens)?;
        // Each turn is the whole conversation as one prompt, computed as a fresh run would
        // compute it; the prefix cache gives back the blocks of the earlier turns' prompts, so
        // only the new part is computed.
        self.session.reset();
        // A different stream each turn, reproducible with --seed.
        self.req.sampling.stream = self.turns;
        self.turns += 1;
        self.interrupt.store(false, Ordering::Relaxed);
        let mut stdout = std::io::stdout();
        let tokenizer = self.tokenizer;
        let reasons = self.template.reasons();
        let mut printer = AnswerPrinter::new(self.reasoning, reasons, opened, self.color);
        let gen = self.session.generate_with(
            tokenizer,
            &tokens,
            &self.req,
            self.speculator.as_mut(),
            |step| {
                report_step(tokenizer, step, true);
                printer.push(&mut stdout, &step.text);
            },
        )?;
        printer.finish(&mut stdout);
        println!();
        let stopped = self.interrupt.swap(false, Ordering::Relaxed);
        eprintln!(
            "{}{}",
            speed_line(&gen),
            if stopped { " (stopped)" } else { "" }
        );
        // The answer goes back to the template as content and reasoning_content (templates
        // such as Qwen3's drop the reasoning of earlier turns); `raw` keeps the text whole.
        let (reasoning, content) = printer.into_parts();
        let mut message = Message::new("assistant", &content);
        message.reasoning_content = reasoning;
        Ok(message)
    }
}

/// `[41 tokens, 23.5 tok/s; prompt 118 tokens, 96 cached, 410.2 tok/s]`, after an answer.
fn speed_line(gen: &Generation) -> String {
    let t = &gen.timings;
    format!(
        "[{} token{}, {:.1} tok/s; prompt {} tokens, {} cached, {:.1} tok/s]",
        t.generated_tokens,
        if t.generated_tokens == 1 { "" } else { "s" },
        t.generate_tokens_per_s,
        t.prompt_tokens,
        gen.cached_tokens,
        t.prompt_tokens_per_s
    )
}
