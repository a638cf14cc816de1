package charts_test

// The platform pages (docs/platforms/*.md) give the exact helm install a user pastes.
// Each of their helm install commands is rendered here with its values, as helm
// install renders it on a cluster of the platform, and the configuration it renders is
// checked with the binary's own validation: a page whose values do not render, or
// whose configuration the webhook would refuse, fails.

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpu-injector/gpu-injector/cmd"
	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/layout"
)

// platformPages are the pages and what helm install learns from their clusters besides
// the Kubernetes version: OpenShift serves its SCC API, which the chart detects.
var platformPages = map[string][]string{
	"aks.md":       nil,
	"crio.md":      nil,
	"eks.md":       nil,
	"gke.md":       nil,
	"kubeadm.md":   nil,
	"openshift.md": {openShiftAPI},
}

// platformChart is the chart a page installs before a release is published: the one
// `make release ... --push REGISTRY` pushed.
const platformChart = "oci://REGISTRY/charts/gpu-injector"

// pageInstall is one helm install of a page, as the user types it.
type pageInstall struct {
	line string
	// set are the --set values, files the -f values files, as the page's heredocs
	// write them.
	set   []string
	files map[string]string
}

// shellWords splits a shell command line into words: single and double quotes,
// backslash escapes, a comment from an unquoted #. It is enough for the pages'
// commands, which use nothing else.
func shellWords(line string) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	for i := 0; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '\'':
			j := strings.IndexByte(line[i+1:], '\'')
			if j < 0 {
				return nil, fmt.Errorf("unterminated ' in %q", line)
			}
			cur.WriteString(line[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case c == '"':
			j := strings.IndexByte(line[i+1:], '"')
			if j < 0 {
				return nil, fmt.Errorf("unterminated \" in %q", line)
			}
			cur.WriteString(line[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case c == '\\' && i+1 < len(line):
			cur.WriteByte(line[i+1])
			i++
			inWord = true
		case c == ' ' || c == '\t':
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
		case c == '#' && !inWord:
			i = len(line)
		case c == ';' || c == '&' || c == '|':
			return nil, fmt.Errorf("a page's helm install is one command, without %q: %q", c, line)
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

// pageInstalls are the helm install commands of a page's sh blocks, continuation lines
// joined, with the files its heredocs (cat > FILE <<'EOF') write.
func pageInstalls(t *testing.T, text string) []pageInstall {
	t.Helper()
	files := map[string]string{}
	var out []pageInstall
	lines := strings.Split(text, "\n")
	sh := false
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		if trimmed := strings.TrimSpace(line); strings.HasPrefix(trimmed, "```") {
			sh = !sh && (trimmed == "```sh" || trimmed == "```bash" || trimmed == "```shell")
			continue
		}
		if !sh {
			continue
		}
		if strings.HasPrefix(line, "cat >") && strings.Contains(line, "<<") {
			name := strings.Fields(strings.TrimPrefix(line, "cat >"))[0]
			end := strings.Trim(line[strings.Index(line, "<<")+2:], ` '"-`)
			var body []string
			for i++; i < len(lines) && lines[i] != end; i++ {
				body = append(body, lines[i])
			}
			files[name] = strings.Join(body, "\n") + "\n"
			continue
		}
		for strings.HasSuffix(line, "\\") && i+1 < len(lines) {
			i++
			line = strings.TrimSuffix(line, "\\") + " " + strings.TrimSpace(lines[i])
		}
		if !strings.HasPrefix(line, "helm install ") && !strings.HasPrefix(line, "helm upgrade --install ") {
			continue
		}
		words, err := shellWords(line)
		if err != nil {
			t.Fatal(err)
		}
		in := pageInstall{line: line, files: map[string]string{}}
		var positional []string
		for j := 2; j < len(words); j++ {
			w := words[j]
			next := func() string {
				if j+1 >= len(words) {
					t.Fatalf("%s needs a value: %s", w, line)
				}
				j++
				return words[j]
			}
			switch {
			case w == "--install":
			case w == "--set":
				in.set = append(in.set, next())
			case w == "-f" || w == "--values":
				name := next()
				content, ok := files[name]
				if !ok {
					t.Fatalf("%s: the page writes no %s before it", line, name)
				}
				in.files[name] = content
			case w == "-n" || w == "--namespace":
				if ns := next(); ns != namespace {
					t.Errorf("%s: namespace %s, want %s as the pages' other commands", line, ns, namespace)
				}
			case w == "--version" || w == "--timeout":
				next()
			case w == "--create-namespace" || w == "--wait":
			case strings.HasPrefix(w, "-"):
				t.Errorf("%s: flag %s is not one the test knows to render; add it here", line, w)
			default:
				positional = append(positional, w)
			}
		}
		if !slices.Equal(positional, []string{releaseName, platformChart}) {
			t.Errorf("%s: want helm install %s %s", line, releaseName, platformChart)
		}
		out = append(out, in)
	}
	return out
}

// valueKeys are the dotted keys a values file sets, down to its leaves.
func valueKeys(prefix string, v any) []string {
	m, ok := v.(map[string]any)
	if !ok || len(m) == 0 {
		return []string{prefix}
	}
	var out []string
	for k, sub := range m {
		key := k
		if prefix != "" {
			key = prefix + "." + k
		}
		out = append(out, valueKeys(key, sub)...)
	}
	return out
}

// TestPlatformPages: every platform page has the steps a user follows (building the
// release, the namespace's opt-in, a GPU pod) and helm install commands whose values
// render, on the oldest tested and a current Kubernetes, into objects of their API
// types and a configuration that the install hook and `gpu-injector config validate`
// accept; and every value a page sets is said, in a list item of its own, on that page.
func TestPlatformPages(t *testing.T) {
	pages, err := filepath.Glob("../docs/platforms/*.md")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pages {
		names = append(names, filepath.Base(p))
	}
	for name := range platformPages {
		if !slices.Contains(names, name) {
			t.Errorf("docs/platforms/%s is missing", name)
		}
	}
	for _, page := range pages {
		name := filepath.Base(page)
		t.Run(name, func(t *testing.T) {
			apis, known := platformPages[name]
			if !known {
				t.Fatalf("a platform page the test does not know: add %s to platformPages", name)
			}
			data, err := os.ReadFile(page)
			if err != nil {
				t.Fatal(err)
			}
			text := string(data)
			for _, want := range []string{"make release VERSION=", `RELEASE_FLAGS="--push REGISTRY"`, "gpu-injector.io/inject=enabled", "nvidia.com/gpu: 1", "gpu-injector status"} {
				if !strings.Contains(text, want) {
					t.Errorf("the page lacks %q", want)
				}
			}
			installs := pageInstalls(t, text)
			if len(installs) == 0 {
				t.Fatal("the page has no helm install in an sh block")
			}
			for _, in := range installs {
				var keys []string
				for _, s := range in.set {
					k, _, ok := strings.Cut(s, "=")
					if !ok {
						t.Errorf("%s: --set %s has no value", in.line, s)
					}
					keys = append(keys, k)
				}
				var files []string
				for fname, content := range in.files {
					var v map[string]any
					if err := yaml.Unmarshal([]byte(content), &v); err != nil {
						t.Fatalf("%s: %s is no YAML: %v", in.line, fname, err)
					}
					keys = append(keys, valueKeys("", v)...)
					files = append(files, writeValues(t, v))
				}
				for _, k := range keys {
					if !strings.Contains(text, "\n- `"+k) {
						t.Errorf("%s: the page does not say why it sets %s (a list item \"- `%s...`: why\")", in.line, k, k)
					}
				}
				// The oldest tested release, and a current one, which serves the
				// MutatingAdmissionPolicy the chart renders by default there.
				for _, cl := range []struct {
					kube string
					apis []string
				}{
					{kube133.kubeVersion, clusterAdmissionAPIs()},
					{kube136.kubeVersion, clusterAdmissionAPIs("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")},
				} {
					kube := cl.kube
					o := renderOpts{kubeVersion: kube, apiVersions: append(slices.Clone(apis), cl.apis...), files: files, set: in.set}
					out, err := helmTemplate(t, o)
					if err != nil {
						t.Errorf("Kubernetes %s: the page's %s does not render: %v", kube, in.line, err)
						continue
					}
					r := parseRendered(t, out)
					var typed rendered
					for _, obj := range r.objects {
						if !strings.HasPrefix(obj.GetAPIVersion(), "security.openshift.io/") {
							typed.objects = append(typed.objects, obj)
						}
					}
					checkKnownTypes(t, typed)
					// Where the chart admits pods with its policy, the page says what users
					// see then.
					if r.get("MutatingAdmissionPolicy", fullname+"-runtime") != nil {
						for _, want := range []string{"gpu-injector.io/admission: policy", "kubectl get mutatingadmissionpolicybinding " + fullname + "-runtime"} {
							if !strings.Contains(text, want) {
								t.Errorf("Kubernetes %s: %s renders the admission policy, and the page does not say %q", kube, in.line, want)
							}
						}
					}
					checkConfigMap(t, r)
					if kube == kube133.kubeVersion {
						checkAtZero(t, text, r, in.line)
					}
					if v := hookVerdict(t, r); !v.Valid() {
						t.Errorf("Kubernetes %s: %s: the install hook refuses the configuration: %v %v", kube, in.line, v.Err, messages(v.Errs))
					}
					var stdout, stderr bytes.Buffer
					if code := cmd.Config([]string{"validate", "-f", "-"}, bytes.NewReader(out), &stdout, &stderr); code != 0 {
						t.Errorf("Kubernetes %s: %s: gpu-injector config validate -f - exited %d:\n%s", kube, in.line, code, stderr.String())
					}
				}
			}
		})
	}
}

// pagePod is the GPU pod a platform page has users apply in the namespace ml.
func pagePod(t *testing.T, text string) string {
	t.Helper()
	const open = "kubectl apply -n ml -f - <<'EOF'\n"
	_, rest, ok := strings.Cut(text, open)
	if !ok {
		t.Fatalf("the page applies no pod with %q", open)
	}
	pod, _, ok := strings.Cut(rest, "\nEOF\n")
	if !ok {
		t.Fatal("the page's pod has no EOF line")
	}
	return pod
}

// checkAtZero runs the page's pod through gpu-injector mutate with the configuration an
// install renders and a cluster of no GPU node (every pool at zero), as the webhook
// answers below 1.36 or while the policy's switch is off: the pod is admitted, the page
// quotes the warning kubectl prints word for word, and every annotation the pod gets.
// go test ./charts -run TestPlatformPages -v logs what each install shows.
func checkAtZero(t *testing.T, text string, r rendered, line string) {
	t.Helper()
	cm := mustGet[corev1.ConfigMap](t, r, "ConfigMap", fullname+"-config")
	dir := t.TempDir()
	files := map[string]string{
		"config.yaml": cm.Data["config.yaml"],
		"nodes.yaml":  "apiVersion: v1\nkind: List\nitems: []\n",
		"pod.yaml": "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: ml\n  labels:\n    " + layout.LabelInject + ": " + layout.InjectEnabled +
			"\n---\n" + pagePod(t, text),
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var stdout, stderr bytes.Buffer
	args := []string{"-f", filepath.Join(dir, "pod.yaml"), "--nodes", filepath.Join(dir, "nodes.yaml"), "--config", filepath.Join(dir, "config.yaml"), "--namespace", "ml"}
	err := cmd.Mutate(args, nil, &stdout, &stderr)
	t.Logf("%s, every pool at zero:\n%s", line, stderr.String())
	if err != nil {
		// hostPath volumes need a layout: with no node and no remembered pool the pod is
		// denied, which the page must say of that install.
		if cfg := checkConfigMap(t, r); cfg.DriverDelivery == config.DeliveryHostPath && strings.Contains(text, "is denied") {
			return
		}
		t.Fatalf("%s: gpu-injector mutate of the page's pod at zero: %v\n%s", line, err, stderr.String())
	}
	if !strings.Contains(stderr.String(), "injected: Pod/cuda") {
		t.Errorf("%s: the page's pod is not admitted while every pool is at zero:\n%s", line, stderr.String())
	}
	for _, l := range strings.Split(stderr.String(), "\n") {
		if w, ok := strings.CutPrefix(l, "warning: Pod/cuda: "); ok && !strings.Contains(text, "\nWarning: "+w+"\n") {
			t.Errorf("%s: the page does not quote, on a line of its own, the warning kubectl prints at zero:\nWarning: %s", line, w)
		}
	}
	var pod corev1.Pod
	docs := strings.Split(stdout.String(), "\n---\n")
	if err := yaml.Unmarshal([]byte(docs[len(docs)-1]), &pod); err != nil {
		t.Fatalf("%s: the mutated pod: %v", line, err)
	}
	for k, v := range pod.Annotations {
		if strings.Contains(k, "gpu-injector") && !strings.Contains(text, k+": '"+v+"'") && !strings.Contains(text, k+": "+v) {
			t.Errorf("%s: the page does not show the annotation the pod gets at zero: %s: %s", line, k, v)
		}
	}
}
