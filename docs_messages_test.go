package main

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// The pages whose quotes of gpu-injector's messages must match the code: where
// users paste a message they got, and where they read what they will see.
var messagePages = []string{"docs/troubleshooting.md", "docs/autoscaling.md", "docs/platforms/*.md"}

// messagePrefixes start gpu-injector's own messages (docs/troubleshooting.md says
// so at its top): an answer of the webhook, the NRI plugin's refusal, or a process
// that exits.
var messagePrefixes = []string{"gpu-injector: ", "gpu-injector webhook: ", "gpu-injector nodeprobe: ", "gpu-injector config validate: "}

// foreign are the words of other programs that gpu-injector's messages carry
// inside them: Go's and Kubernetes' libraries' errors, a registry's answer. A
// quote may hold them where the code formats an error it was given.
var foreign = []string{
	"unexpected EOF", // encoding/json
	"error unmarshaling JSON: while decoding JSON: json: unknown field", // sigs.k8s.io/yaml, encoding/json
	"Unsupported value", "supported values", "Forbidden", "Required value", "Invalid value", // k8s.io/apimachinery field errors
	"authentication required",        // a registry's UNAUTHORIZED answer
	"flag provided but not defined",  // Go's flag package
	"no such file or directory",      // the C library
	"cannot open shared object file", // the dynamic loader
	"not a shared or slave mount",    // containerd
	"is mounted on",                  // containerd
	"Exists",                         // a toleration's operator, as Kubernetes spells it
}

// productStrings are the string literals of the product's Go code (no test, no
// test tooling), split where a format verb stands for a value: the pieces a
// message is made of.
func productStrings(t *testing.T) []string {
	t.Helper()
	skip := []string{"_output", "e2e", "hack", ".git", "vendor"}
	var pieces []string
	verb := regexp.MustCompile(`%[-+# 0]*(\[\d+\])?(\d+|\*)?(\.(\d+|\*)?)?[a-zA-Z]`)
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if slices.Contains(skip, filepath.ToSlash(path)) || strings.Contains(path, "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				return true
			}
			for _, p := range verb.Split(strings.ReplaceAll(s, "%%", "\x00"), -1) {
				if p = strings.ReplaceAll(p, "\x00", "%"); strings.IndexFunc(p, unicode.IsLetter) >= 0 {
					pieces = append(pieces, p)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return append(pieces, foreign...)
}

// quote is a message a page quotes, and where.
type quote struct {
	where, text string
}

var (
	inlineCode = regexp.MustCompile("`([^`]+)`")
	// conditionLine is a probe's state reason as the Node's annotation holds
	// it: its condition, then its message.
	conditionLine = regexp.MustCompile(`^([A-Z][a-z]+[A-Za-z]*): `)
)

// quotes are the messages of gpu-injector that a page quotes: in code blocks and
// inline code, from one of messagePrefixes on; in code blocks, the msg and error of
// a JSON log line, the message of a console log line, and a probe's state reason.
func quotes(t *testing.T, path string, conditions map[string]bool) []quote {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []quote
	fence := false
	for n, line := range strings.Split(string(data), "\n") {
		where := path + ":" + strconv.Itoa(n+1)
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fence = !fence
			continue
		}
		var texts []string
		if fence {
			texts = []string{strings.TrimSpace(line)}
		} else {
			for _, m := range inlineCode.FindAllStringSubmatch(line, -1) {
				texts = append(texts, m[1])
			}
		}
		for _, text := range texts {
			if fence && strings.HasPrefix(text, "{") && strings.HasSuffix(text, "}") {
				var log map[string]any
				if json.Unmarshal([]byte(text), &log) == nil {
					for _, k := range []string{"msg", "error"} {
						if s, ok := log[k].(string); ok {
							out = append(out, quote{where, s})
						}
					}
					continue
				}
			}
			if fence {
				if msg, _, ok := strings.Cut(text, "\t{"); ok && !strings.ContainsAny(msg, "$#") && strings.Contains(text, `"}`) {
					out = append(out, quote{where, msg})
					continue
				}
				if m := conditionLine.FindStringSubmatch(text); m != nil && conditions[m[1]] {
					out = append(out, quote{where, text})
					continue
				}
			}
			at := -1
			for _, p := range messagePrefixes {
				if i := strings.Index(text, p); i >= 0 && (at < 0 || i < at) {
					at = i
				}
			}
			// A command line that names a release or a chart is no message.
			if at >= 0 && !strings.HasPrefix(text, "helm ") && !strings.HasPrefix(text, "kubectl ") {
				out = append(out, quote{where, text[at:]})
			}
		}
	}
	return out
}

// explained reports whether the code's pieces make up msg: each piece where it
// stands, with values between them (a word with a digit, a path, a name in quotes,
// a placeholder in capitals) and "..." where the page leaves part out. It returns
// how far the longest explanation reaches.
func explained(msg string, pieces []string) (bool, int) {
	best := 0
	for _, part := range strings.Split(msg, "...") {
		ok, n := explainedPart(part, pieces)
		if !ok {
			return false, best + n
		}
		best += len(part) + 3
	}
	return true, len(msg)
}

func explainedPart(s string, pieces []string) (bool, int) {
	reach := make([]bool, len(s)+1)
	reach[0] = true
	far := 0
	for i := 0; i < len(s); i++ {
		if !reach[i] {
			continue
		}
		far = i
		c := rune(s[i])
		if unicode.IsSpace(c) || unicode.IsPunct(c) && c != '"' || unicode.IsSymbol(c) {
			reach[i+1] = true
		}
		if c == '"' {
			if j := strings.IndexByte(s[i+1:], '"'); j >= 0 {
				reach[i+j+2] = true
			}
		}
		end := i
		for end < len(s) && !unicode.IsSpace(rune(s[end])) {
			end++
		}
		for j := i + 1; j <= end; j++ {
			if value(strings.Trim(s[i:j], `()[]{},;:.'"`)) {
				reach[j] = true
			}
		}
		for _, p := range pieces {
			switch {
			case strings.HasPrefix(s[i:], p):
				reach[i+len(p)] = true
			case len(s)-i >= 8 && strings.HasPrefix(p, s[i:]):
				// The page's line or part ends inside the piece.
				reach[len(s)] = true
			case i == 0 && len(p) >= 8:
				// The part begins inside the piece, after "...".
				for k := len(p) - 1; k > 0 && len(p)-k <= len(s); k-- {
					if strings.HasPrefix(s, p[k:]) && len(p)-k >= 8 {
						reach[len(p)-k] = true
					}
				}
			}
		}
	}
	if reach[len(s)] {
		return true, len(s)
	}
	return false, far
}

// value reports whether a word of a quote stands for a value the code formats
// into its message, not a word of the message itself.
func value(w string) bool {
	if w == "" {
		return false
	}
	if strings.ContainsAny(w, "0123456789./=_:@<>*~") {
		return true
	}
	// An API's value (NoSchedule, CreateContainerError): capitals inside a word.
	if strings.IndexFunc(w[1:], unicode.IsUpper) >= 0 && strings.IndexFunc(w[1:], unicode.IsLower) >= 0 {
		return true
	}
	upper := true
	for _, r := range w {
		if !unicode.IsUpper(r) && r != '-' {
			upper = false
		}
	}
	return upper && len(w) > 1
}

// conditionNames are the probe's condition names: the constants of nodeprobe's
// Condition type, as a state reason starts.
func conditionNames(t *testing.T) map[string]bool {
	t.Helper()
	data, err := os.ReadFile("nodeprobe/probe.go")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, m := range regexp.MustCompile(`Condition[A-Za-z]+\s+Condition = "([A-Za-z]+)"`).FindAllStringSubmatch(string(data), -1) {
		out[m[1]] = true
	}
	if len(out) == 0 {
		t.Fatal("no condition names in nodeprobe/probe.go")
	}
	return out
}

// TestQuotedMessagesInCode: every message of gpu-injector that the troubleshooting
// page, the autoscaling page and the platform pages quote is made of the product
// code's strings, so that a message reworded in the code fails here until the pages
// quote it as users will now see it.
func TestQuotedMessagesInCode(t *testing.T) {
	pieces := productStrings(t)
	conditions := conditionNames(t)
	checked := 0
	for _, pattern := range messagePages {
		pages, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		for _, page := range pages {
			for _, q := range quotes(t, page, conditions) {
				checked++
				if ok, n := explained(q.text, pieces); !ok {
					t.Errorf("%s: the code has no message that reads\n  %s\nfrom here on:\n  %s", q.where, q.text, q.text[min(n, len(q.text)):])
				}
			}
		}
	}
	if checked < 20 {
		t.Errorf("only %d quotes found: the pages' quote format changed?", checked)
	}
}

// TestQuoteCheckCatchesRewording: the check above tells the code's words from a
// quote one word of which was changed.
func TestQuoteCheckCatchesRewording(t *testing.T) {
	pieces := productStrings(t)
	const warning = "gpu-injector: no GPU node is ready yet (every pool at zero?): admitted for the node that takes it, as an autoscaler adds one, whose NRI plugin or container toolkit delivers the driver; if it stays Pending, see `gpu-injector status`"
	const remembered = "gpu-injector: pool karpenter.sh/nodepool=gpu-t4 has no ready node; injected the layout its nodes published last (driver 535.104.05, last seen 2026-03-01T12:00:00Z, remembered until 2026-03-08T12:00:00Z), so that the autoscaler can add a node for this pod"
	for msg, want := range map[string]bool{
		warning:    true,
		remembered: true,
		"... denied the request: gpu-injector: no ready GPU node layout fits this pod: layout fbb583b972381af27e5c (driver 535.104.05, 1 nodes): no node matches the pod's nodeSelector or required node affinity; check the pod's ...": true,
		strings.Replace(warning, "ready yet", "ready now", 1):                     false,
		strings.Replace(warning, "admitted for", "accepted for", 1):               false,
		strings.Replace(remembered, "has no ready node", "lacks a ready node", 1): false,
		"gpu-injector: the pod is fine":                                           false,
	} {
		if got, _ := explained(msg, pieces); got != want {
			t.Errorf("explained = %v, want %v:\n%s", got, want, msg)
		}
	}
}
