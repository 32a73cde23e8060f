//! Child processes that never outlive the agent: prctl(2) `PR_SET_PDEATHSIG` set between
//! fork and exec, and a process group of their own.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// Makes the process `cmd` starts die with the agent: the kernel sends it `SIGKILL` when the
/// thread that started it ends (prctl(2) `PR_SET_PDEATHSIG`: "the parent" is the creating
/// thread; the agent starts such children from the thread that owns them until it ends),
/// also when the agent is SIGKILLed or crashes, where no destructor runs. If the agent died
/// between fork and the prctl, exec fails and the child exits at once (the parent pid
/// check of prctl(2)'s notes). The child also gets a process group of its own
/// (setpgid(2), `process_group(0)`): a terminal's Ctrl-C, sent to the foreground group,
/// reaches the agent, which shuts down in order and stops the child itself.
///
/// Linux only (prctl(2)); the agent runs nowhere else.
pub fn die_with_agent(cmd: &mut Command) -> &mut Command {
    let parent = std::process::id();
    cmd.process_group(0);
    // SAFETY: the closure runs in the forked child before exec and calls only prctl(2) and
    // getppid(2), both async-signal-safe (signal-safety(7)); it allocates nothing and takes
    // no lock (`from_raw_os_error` and `last_os_error` read errno into a plain value).
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Reparented already: the agent is gone, and the signal would never come.
            if u32::try_from(libc::getppid()).ok() != Some(parent) {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_child_runs_with_the_death_signal_set_in_its_own_group() {
        let out = die_with_agent(Command::new("sh").args(["-c", "ps -o pgid= -p $$; echo $$"]))
            .output()
            .unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        let v: Vec<&str> = text.split_whitespace().collect();
        assert_eq!(v.len(), 2, "{text}");
        assert_eq!(v[0], v[1], "its own process group");
    }
}
