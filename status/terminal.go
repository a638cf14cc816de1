package status

import (
	"io"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

type terminal struct {
	isTerminal bool
	// width is the terminal's columns; 0 means unknown or not a terminal,
	// and nothing is cut.
	width int
}

// terminalOf asks the kernel about w's window: only a terminal has one, so
// that one call says both whether w is a terminal and how wide it is.
func terminalOf(w io.Writer) terminal {
	f, ok := w.(*os.File)
	if !ok {
		return terminal{}
	}
	ws, err := unix.IoctlGetWinsize(int(f.Fd()), unix.TIOCGWINSZ)
	if err != nil {
		return terminal{}
	}
	t := terminal{isTerminal: true, width: int(ws.Col)}
	// $COLUMNS wins, as for ls: a user may ask for a narrower table.
	if c, err := strconv.Atoi(os.Getenv("COLUMNS")); err == nil && c > 0 {
		t.width = c
	}
	return t
}

// noColor follows https://no-color.org: any value turns colour off.
func noColor() bool {
	_, set := os.LookupEnv("NO_COLOR")
	return set
}
