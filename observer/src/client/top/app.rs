//! `top`'s state and what each key does: a stack of screens (jobs, then a
//! job's ranks, then a rank's functions, or the job's matrix), each with its
//! selection, sort key and filter. No terminal here, so the tests drive it
//! with key events and a frame.

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use super::model::{self, Frame, RankKey};

/// What a screen shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Screen {
    /// Every job.
    Jobs,
    /// One job's ranks.
    Ranks {
        /// The job.
        job: String,
    },
    /// One rank's functions.
    Functions {
        /// The rank.
        rank: RankKey,
    },
    /// One job's rank × rank matrix of bytes sent.
    Matrix {
        /// The job.
        job: String,
    },
}

impl Screen {
    /// The sort keys `s` cycles through.
    pub fn sorts(&self) -> &'static [&'static str] {
        match self {
            Screen::Jobs => &model::JOB_SORTS,
            Screen::Ranks { .. } => &model::RANK_SORTS,
            Screen::Functions { .. } => &model::FUNC_SORTS,
            Screen::Matrix { .. } => &[],
        }
    }

    /// The job it belongs to, if any.
    pub fn job(&self) -> Option<&str> {
        match self {
            Screen::Jobs => None,
            Screen::Ranks { job } | Screen::Matrix { job } => Some(job),
            Screen::Functions { rank } => Some(&rank.jobid),
        }
    }
}

/// A screen with its own selection, sort and filter.
#[derive(Clone, Debug)]
pub struct View {
    /// What it shows.
    pub screen: Screen,
    /// The selected row's key (job id, rank, function), kept across
    /// refreshes and re-sorts; the first row when `None` or gone.
    pub selected: Option<String>,
    /// Index into [`Screen::sorts`].
    pub sort: usize,
    /// Case-insensitive substring filter.
    pub filter: String,
}

impl View {
    fn new(screen: Screen) -> View {
        View {
            screen,
            selected: None,
            sort: 0,
            filter: String::new(),
        }
    }
}

/// The whole state.
pub struct App {
    /// Screens, the jobs screen at the bottom, the one shown on top.
    pub stack: Vec<View>,
    /// While `/` is being typed: the filter as it was before, restored
    /// by Esc.
    pub editing: Option<String>,
    /// The latest frame read.
    pub frame: Option<Frame>,
    /// Why the latest reading failed, if it did (the frame shown is older).
    pub error: Option<String>,
    /// Where it reads from, for the title.
    pub source: String,
    /// The key help overlay is shown.
    pub help: bool,
    /// `q` was pressed.
    pub quit: bool,
}

/// Rows a page key moves.
const PAGE: usize = 10;

impl App {
    /// Starts on the jobs screen, or on `job`'s ranks.
    pub fn new(source: String, job: Option<String>) -> App {
        let mut stack = vec![View::new(Screen::Jobs)];
        if let Some(job) = job {
            stack[0].selected = Some(job.clone());
            stack.push(View::new(Screen::Ranks { job }));
        }
        App {
            stack,
            editing: None,
            frame: None,
            error: None,
            source,
            help: false,
            quit: false,
        }
    }

    /// The screen shown.
    pub fn view(&self) -> &View {
        self.stack.last().expect("the jobs screen is never popped")
    }

    fn view_mut(&mut self) -> &mut View {
        self.stack
            .last_mut()
            .expect("the jobs screen is never popped")
    }

    /// The keys of the shown screen's rows, in display order.
    pub fn row_keys(&self) -> Vec<String> {
        let Some(f) = &self.frame else {
            return Vec::new();
        };
        let v = self.view();
        match &v.screen {
            Screen::Jobs => model::jobs(f, &v.filter, v.sort)
                .into_iter()
                .map(|r| r.jobid)
                .collect(),
            Screen::Ranks { job } => model::ranks(f, job, &v.filter, v.sort)
                .into_iter()
                .map(|r| r.key.rank)
                .collect(),
            Screen::Functions { rank } => model::functions(f, rank, &v.filter, v.sort)
                .into_iter()
                .map(|r| r.name)
                .collect(),
            Screen::Matrix { .. } => Vec::new(),
        }
    }

    /// The index of the selected row among `keys`.
    pub fn selected_index(&self, keys: &[String]) -> Option<usize> {
        if keys.is_empty() {
            return None;
        }
        let sel = self.view().selected.as_ref();
        Some(
            sel.and_then(|s| keys.iter().position(|k| k == s))
                .unwrap_or(0),
        )
    }

    fn move_by(&mut self, delta: isize) {
        let keys = self.row_keys();
        let Some(i) = self.selected_index(&keys) else {
            return;
        };
        let j = i.saturating_add_signed(delta).min(keys.len() - 1);
        self.view_mut().selected = Some(keys[j].clone());
    }

    fn open(&mut self) {
        let keys = self.row_keys();
        let Some(i) = self.selected_index(&keys) else {
            return;
        };
        let key = keys[i].clone();
        self.view_mut().selected = Some(key.clone());
        let next = match &self.view().screen {
            Screen::Jobs => Screen::Ranks { job: key },
            Screen::Ranks { job } => Screen::Functions {
                rank: RankKey::new(job, &key),
            },
            Screen::Functions { .. } | Screen::Matrix { .. } => return,
        };
        self.stack.push(View::new(next));
    }

    fn back(&mut self) {
        if self.stack.len() > 1 {
            self.stack.pop();
        }
    }

    fn matrix(&mut self) {
        let job = match &self.view().screen {
            Screen::Jobs => {
                let keys = self.row_keys();
                match self.selected_index(&keys) {
                    Some(i) => keys[i].clone(),
                    None => return,
                }
            }
            Screen::Matrix { .. } => return,
            s => s.job().unwrap_or_default().to_string(),
        };
        self.stack.push(View::new(Screen::Matrix { job }));
    }

    /// Applies one key.
    pub fn key(&mut self, k: KeyEvent) {
        if k.kind == KeyEventKind::Release {
            return;
        }
        if k.modifiers.contains(KeyModifiers::CONTROL) && k.code == KeyCode::Char('c') {
            self.quit = true;
            return;
        }
        if let Some(before) = &self.editing {
            match k.code {
                KeyCode::Enter => self.editing = None,
                KeyCode::Esc => {
                    let before = before.clone();
                    self.view_mut().filter = before;
                    self.editing = None;
                }
                KeyCode::Backspace => {
                    self.view_mut().filter.pop();
                }
                KeyCode::Char(c) if !c.is_control() => self.view_mut().filter.push(c),
                _ => {}
            }
            return;
        }
        if self.help {
            // Any key closes the help; `q` still quits.
            self.help = false;
            if k.code != KeyCode::Char('q') {
                return;
            }
        }
        match k.code {
            KeyCode::Char('q') => self.quit = true,
            KeyCode::Up | KeyCode::Char('k') => self.move_by(-1),
            KeyCode::Down | KeyCode::Char('j') => self.move_by(1),
            KeyCode::PageUp => self.move_by(-(PAGE as isize)),
            KeyCode::PageDown => self.move_by(PAGE as isize),
            KeyCode::Home => self.move_by(isize::MIN / 2),
            KeyCode::End => self.move_by(isize::MAX / 2),
            KeyCode::Enter | KeyCode::Right => self.open(),
            KeyCode::Esc | KeyCode::Left | KeyCode::Backspace => self.back(),
            KeyCode::Char('s') => {
                let n = self.view().screen.sorts().len();
                if n > 0 {
                    let v = self.view_mut();
                    v.sort = (v.sort + 1) % n;
                }
            }
            KeyCode::Char('S') => {
                let n = self.view().screen.sorts().len();
                if n > 0 {
                    let v = self.view_mut();
                    v.sort = (v.sort + n - 1) % n;
                }
            }
            KeyCode::Char('/') if !matches!(self.view().screen, Screen::Matrix { .. }) => {
                self.editing = Some(self.view().filter.clone());
            }
            KeyCode::Char('m') => self.matrix(),
            KeyCode::Char('?') | KeyCode::Char('h') => self.help = true,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::client::top::source::{Reading, parse_exposition};

    fn frame() -> Frame {
        let text = "mpi_rank_info{jobid=\"a\",rank=\"0\",pid=\"10\"} 1\n\
                    mpi_rank_info{jobid=\"a\",rank=\"1\",pid=\"11\"} 1\n\
                    mpi_rank_info{jobid=\"b\",rank=\"0\",pid=\"20\"} 1\n\
                    mpi_calls_total{jobid=\"a\",rank=\"0\",function=\"MPI_Send\"} 5\n\
                    mpi_call_seconds_total{jobid=\"a\",rank=\"0\",function=\"MPI_Send\"} 5\n\
                    mpi_calls_total{jobid=\"a\",rank=\"1\",function=\"MPI_Recv\"} 5\n\
                    mpi_call_seconds_total{jobid=\"a\",rank=\"1\",function=\"MPI_Recv\"} 1\n\
                    mpi_calls_total{jobid=\"a\",rank=\"1\",function=\"MPI_Barrier\"} 5\n\
                    mpi_call_seconds_total{jobid=\"a\",rank=\"1\",function=\"MPI_Barrier\"} 2\n\
                    mpi_calls_total{jobid=\"b\",rank=\"0\",function=\"MPI_Bcast\"} 1\n\
                    mpi_call_seconds_total{jobid=\"b\",rank=\"0\",function=\"MPI_Bcast\"} 1\n";
        let samples = parse_exposition(text)
            .into_iter()
            .map(|mut s| {
                s.labels.push(("instance".into(), "n:1".into()));
                s
            })
            .collect();
        Frame::new(
            &Reading {
                at: Instant::now(),
                samples,
                rates: None,
            },
            None,
        )
    }

    fn press(app: &mut App, code: KeyCode) {
        app.key(KeyEvent::new(code, KeyModifiers::NONE));
    }

    fn app() -> App {
        let mut a = App::new("test".into(), None);
        a.frame = Some(frame());
        a
    }

    #[test]
    fn navigate_into_a_rank_and_back() {
        let mut a = app();
        // Jobs sorted by MPI % (no rates yet: all 0, then by id).
        assert_eq!(a.row_keys(), ["a", "b"]);
        press(&mut a, KeyCode::Down);
        press(&mut a, KeyCode::Up);
        press(&mut a, KeyCode::Enter);
        assert_eq!(a.view().screen, Screen::Ranks { job: "a".into() });
        assert_eq!(a.row_keys(), ["0", "1"]);
        press(&mut a, KeyCode::Down);
        press(&mut a, KeyCode::Down);
        press(&mut a, KeyCode::Enter);
        assert_eq!(
            a.view().screen,
            Screen::Functions {
                rank: RankKey::new("a", "1")
            }
        );
        assert_eq!(a.row_keys(), ["MPI_Barrier", "MPI_Recv"], "by time");
        press(&mut a, KeyCode::Char('s'));
        press(&mut a, KeyCode::Char('s'));
        press(&mut a, KeyCode::Char('s'));
        press(&mut a, KeyCode::Char('s'));
        assert_eq!(a.view().screen.sorts()[a.view().sort], "name");
        assert_eq!(a.row_keys(), ["MPI_Barrier", "MPI_Recv"]);
        press(&mut a, KeyCode::Esc);
        assert_eq!(a.view().selected.as_deref(), Some("1"), "selection kept");
        press(&mut a, KeyCode::Esc);
        press(&mut a, KeyCode::Esc);
        assert_eq!(a.stack.len(), 1, "the jobs screen stays");
        assert!(!a.quit);
        press(&mut a, KeyCode::Char('q'));
        assert!(a.quit);
    }

    #[test]
    fn filter_typing_cancel_and_keep() {
        let mut a = app();
        press(&mut a, KeyCode::Char('/'));
        press(&mut a, KeyCode::Char('B'));
        assert_eq!(a.row_keys(), ["b"], "applied while typing");
        press(&mut a, KeyCode::Char('q'));
        assert!(!a.quit, "typed, not a command");
        press(&mut a, KeyCode::Esc);
        assert_eq!(a.view().filter, "", "Esc restores the filter");
        press(&mut a, KeyCode::Char('/'));
        press(&mut a, KeyCode::Char('a'));
        press(&mut a, KeyCode::Enter);
        assert_eq!(a.row_keys(), ["a"]);
        assert!(a.editing.is_none());
    }

    #[test]
    fn matrix_and_start_on_a_job() {
        let mut a = App::new("t".into(), Some("b".into()));
        a.frame = Some(frame());
        assert_eq!(a.view().screen, Screen::Ranks { job: "b".into() });
        press(&mut a, KeyCode::Char('m'));
        assert_eq!(a.view().screen, Screen::Matrix { job: "b".into() });
        press(&mut a, KeyCode::Char('m'));
        assert_eq!(a.stack.len(), 3, "no matrix over a matrix");
        press(&mut a, KeyCode::Left);
        press(&mut a, KeyCode::Left);
        assert_eq!(a.view().selected.as_deref(), Some("b"));
        press(&mut a, KeyCode::Char('?'));
        assert!(a.help);
        press(&mut a, KeyCode::Char('x'));
        assert!(!a.help && !a.quit);
        a.key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL));
        assert!(a.quit);
    }
}
