//! The live `uctel top`: fetches the status document every interval and draws
//! [`crate::view::top`] with ratatui on crossterm (the alternate screen, restored on exit
//! and on a panic). Keys: `l` `r` `d` `g` sort by loss, rate, drops, lag; `q`, Esc or
//! Ctrl-C quit.

use std::time::{Duration, Instant};

use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Text};
use ratatui::widgets::Paragraph;

use crate::SortKey;

/// Runs the view until the user quits.
///
/// # Errors
/// The terminal could not be set up or read, as text.
pub fn run(
    http: &ureq::Agent,
    url: &str,
    mut sort: SortKey,
    every: Duration,
) -> Result<(), String> {
    let mut terminal = ratatui::try_init().map_err(|e| format!("terminal: {e}"))?;
    let result = (|| -> std::io::Result<()> {
        let mut doc: Option<serde_json::Value> = None;
        let mut error: Option<String> = None;
        let mut next = Instant::now();
        loop {
            if Instant::now() >= next {
                match crate::fetch(http, url) {
                    Ok(d) => {
                        doc = Some(d);
                        error = None;
                    }
                    Err(e) => error = Some(e),
                }
                next = Instant::now() + every;
            }
            terminal.draw(|f| {
                let width = usize::from(f.area().width);
                let mut lines: Vec<Line> = match &doc {
                    Some(d) => crate::view::top(d, sort, width)
                        .into_iter()
                        .enumerate()
                        .map(|(i, l)| {
                            if i < 2 {
                                Line::styled(l, Style::default().add_modifier(Modifier::BOLD))
                            } else {
                                Line::raw(l)
                            }
                        })
                        .collect(),
                    None => vec![Line::raw(format!("uctel top · waiting for {url}"))],
                };
                if let Some(e) = &error {
                    lines.push(Line::styled(
                        format!("fetch failed (showing the last answer): {e}"),
                        Style::default().add_modifier(Modifier::REVERSED),
                    ));
                }
                lines.push(Line::raw("keys: l loss, r rate, d drops, g lag; q quits"));
                f.render_widget(Paragraph::new(Text::from(lines)), f.area());
            })?;
            let wait = next.saturating_duration_since(Instant::now());
            if event::poll(wait)? {
                if let Event::Key(k) = event::read()? {
                    if k.kind != KeyEventKind::Press {
                        continue;
                    }
                    match k.code {
                        KeyCode::Char('q') | KeyCode::Esc => return Ok(()),
                        KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => {
                            return Ok(())
                        }
                        KeyCode::Char('l') => sort = SortKey::Loss,
                        KeyCode::Char('r') => sort = SortKey::Rate,
                        KeyCode::Char('d') => sort = SortKey::Drops,
                        KeyCode::Char('g') => sort = SortKey::Lag,
                        _ => {}
                    }
                }
            }
        }
    })();
    ratatui::restore();
    result.map_err(|e| format!("terminal: {e}"))
}
