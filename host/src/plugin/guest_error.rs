//! The cause of a trap, read from what the guest wrote to stderr before it
//! trapped: an uncaught Python exception (componentize-py prints the
//! traceback, then traps on `unreachable`), a JavaScript error, or a Rust
//! panic of a plugin built without the guest SDK's panic hook. wasmtime only
//! says `wasm 'unreachable' instruction executed`; the author needs the
//! exception and where it was raised, so that is what the fault's reason
//! (`x-acemq-error`, `dlq list`) says.
//!
//! Pure text work on a bounded capture (`wasi::MAX_CALL_OUTPUT_BYTES`).

/// The cause as a fault's reason, when `stderr` holds one in a form this
/// module knows: `uncaught exception: NameError: name 'x' is not defined
/// (app.py, line 12, in handle)`, or `panic: {message} at {file:line:col}`
/// (the words of the SDK's own panic reason).
pub fn cause(stderr: &str) -> Option<String> {
    python_exception(stderr)
        .or_else(|| javascript_error(stderr))
        .map(|exception| format!("uncaught exception: {exception}"))
        .or_else(|| rust_panic(stderr))
}

/// The last traceback's exception line and its innermost frame.
fn python_exception(stderr: &str) -> Option<String> {
    let lines: Vec<&str> = stderr.lines().collect();
    let start = lines
        .iter()
        .rposition(|line| line.trim_start() == "Traceback (most recent call last):")?;
    let mut frame = None;
    let mut exception = None;
    for line in &lines[start + 1..] {
        if let Some(at) = line.trim_start().strip_prefix("File ") {
            frame = python_frame(at);
        } else if !line.starts_with(' ') && !line.trim().is_empty() {
            // The first line back at the margin is the exception
            // (`NameError: ...`, or a bare `KeyboardInterrupt`).
            exception = Some(line.trim_end());
            break;
        }
    }
    let exception = exception?;
    Some(match frame {
        Some(frame) => format!("{exception} ({frame})"),
        None => exception.to_string(),
    })
}

/// `"/src/app.py", line 12, in handle` -> `app.py, line 12, in handle`.
fn python_frame(at: &str) -> Option<String> {
    let rest = at.strip_prefix('"')?;
    let (path, rest) = rest.split_once('"')?;
    let file = path.rsplit('/').next().unwrap_or(path);
    let rest = rest.trim_start_matches(',').trim();
    Some(if rest.is_empty() {
        file.to_string()
    } else {
        format!("{file}, {rest}")
    })
}

/// A JavaScript engine's report of an uncaught error and the head of its
/// stack. componentize-js (SpiderMonkey) prints the message alone, then
/// `Stack:` and one `function@file:line:col` frame a line, innermost first
/// (`undefinedName is not defined` / `Stack:` / `  decide@app.js:4:3`);
/// V8-style engines print `Name: message` and `at function (file:line:col)`
/// frames.
fn javascript_error(stderr: &str) -> Option<String> {
    let lines: Vec<&str> = stderr.lines().map(str::trim).collect();
    let position = match lines.iter().rposition(|line| *line == "Stack:") {
        // The message is what comes before the stack, back to the margin.
        Some(stack) => lines[..stack].iter().rposition(|line| !line.is_empty())?,
        None => lines.iter().rposition(|line| is_js_error_line(line))?,
    };
    let error = without_engine_prefix(lines[position]);
    let at = lines[position + 1..]
        .iter()
        .take(4)
        .find_map(|line| js_stack_head(line));
    Some(match at {
        Some(at) => format!("{error} (at {at})"),
        None => error.to_string(),
    })
}

fn is_js_error_line(line: &str) -> bool {
    const NAMES: [&str; 8] = [
        "Error",
        "TypeError",
        "ReferenceError",
        "RangeError",
        "SyntaxError",
        "EvalError",
        "URIError",
        "AggregateError",
    ];
    let line = without_engine_prefix(line);
    NAMES
        .iter()
        .any(|name| line == *name || line.starts_with(&format!("{name}: ")))
}

/// The error line without the words an engine puts before it.
fn without_engine_prefix(line: &str) -> &str {
    ["Uncaught ", "Error while running code: ", "Exception: "]
        .iter()
        .find_map(|prefix| line.strip_prefix(prefix))
        .unwrap_or(line)
}

/// `handle@app.js:12:5` or `at handle (app.js:12:5)` -> `handle (app.js:12:5)`.
fn js_stack_head(line: &str) -> Option<String> {
    let short = |location: &str| location.rsplit('/').next().unwrap_or(location).to_string();
    if let Some(rest) = line.strip_prefix("at ") {
        return Some(match rest.split_once(" (") {
            Some((function, location)) => {
                format!("{function} ({})", short(location.trim_end_matches(')')))
            }
            None => short(rest),
        });
    }
    let (function, location) = line.split_once('@')?;
    location.contains(':').then(|| {
        if function.is_empty() {
            short(location)
        } else {
            format!("{function} ({})", short(location))
        }
    })
}

/// `thread '<unnamed>' panicked at src/lib.rs:10:5:` and its message line.
fn rust_panic(stderr: &str) -> Option<String> {
    let lines: Vec<&str> = stderr.lines().collect();
    let position = lines
        .iter()
        .rposition(|line| line.contains("panicked at "))?;
    let line = lines[position];
    let at = line.split_once("panicked at ")?.1.trim_end_matches(':');
    // Since Rust 1.73 the message is on the next line; before, after a comma.
    match at.split_once(", ") {
        Some((message, location)) if location.contains(".rs:") => Some(format!(
            "panic: {} at {location}",
            message.trim_matches('\'')
        )),
        _ => {
            let message = lines.get(position + 1).map(|m| m.trim()).unwrap_or("");
            Some(if message.is_empty() || message.starts_with("note:") {
                format!("panic at {at}")
            } else {
                format!("panic: {message} at {at}")
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_python_traceback_gives_its_exception_and_innermost_frame() {
        let stderr = "\
Traceback (most recent call last):
  File \"/plugin/app.py\", line 30, in handle
    return route(message)
           ^^^^^^^^^^^^^^
  File \"/plugin/app.py\", line 12, in route
    total = undefined_name + 1
            ^^^^^^^^^^^^^^
NameError: name 'undefined_name' is not defined
";
        assert_eq!(
            cause(stderr).as_deref(),
            Some(
                "uncaught exception: NameError: name 'undefined_name' is not defined (app.py, line 12, in route)"
            )
        );
    }

    #[test]
    fn the_last_of_several_tracebacks_is_the_one_that_trapped() {
        let stderr = "\
Traceback (most recent call last):
  File \"app.py\", line 3, in <module>
KeyError: 'a'
printed between
Traceback (most recent call last):
  File \"app.py\", line 9, in handle
ValueError: invalid literal for int() with base 10: 'x'
";
        assert_eq!(
            cause(stderr).as_deref(),
            Some(
                "uncaught exception: ValueError: invalid literal for int() with base 10: 'x' (app.py, line 9, in handle)"
            )
        );
    }

    #[test]
    fn a_javascript_error_gives_its_message_and_stack_head() {
        let spider = "Error while running code: TypeError: order.total is undefined\nStack:\n  route@app.js:14:9\n  handle@app.js:30:12\n";
        assert_eq!(
            cause(spider).as_deref(),
            Some(
                "uncaught exception: TypeError: order.total is undefined (at route (app.js:14:9))"
            )
        );
        // As componentize-js 0.23 prints it, seen on a real component.
        let starling = "undefinedName is not defined\nStack:\n  decide@app.js:4:3\n  handle@app.js:9:12\n  export_handler_0_4_0$handle@/tmp/4a11f7db15d9/sources/initializer.js:1584:15\nRedirecting call to abort() to mozalloc_abort\n";
        assert_eq!(
            cause(starling).as_deref(),
            Some("uncaught exception: undefinedName is not defined (at decide (app.js:4:3))")
        );
        let v8 = "Uncaught ReferenceError: x is not defined\n    at handle (file:///plugin/app.js:7:3)\n";
        assert_eq!(
            cause(v8).as_deref(),
            Some("uncaught exception: ReferenceError: x is not defined (at handle (app.js:7:3))")
        );
    }

    #[test]
    fn a_rust_panic_gives_its_place_and_message() {
        let stderr = "\nthread '<unnamed>' panicked at src/lib.rs:10:5:\nthe order has no id\nnote: run with `RUST_BACKTRACE=1`\n";
        assert_eq!(
            cause(stderr).as_deref(),
            Some("panic: the order has no id at src/lib.rs:10:5")
        );
    }

    #[test]
    fn ordinary_output_names_no_cause() {
        assert_eq!(cause(""), None);
        assert_eq!(cause("routing order 7 to eu\nwarning: slow\n"), None);
        // A word that merely starts like an error name is not one.
        assert_eq!(cause("Errors: none\n"), None);
    }
}
