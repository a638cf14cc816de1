package config

import (
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/layout/pools"
)

// MaxPinningLabels bounds the pool key: every label is a nodeSelector term
// and a ConfigMap key part.
const MaxPinningLabels = 8

// The values of the fields that take one of a few, in the order the messages
// list them.
var (
	renameTolerations       = []RenameToleration{RenameTolerationAdd, RenameTolerationNone}
	ldLibraryPaths          = []LDLibraryPath{LDLibraryPathAppend, LDLibraryPathPrepend, LDLibraryPathOff}
	containerChoices        = []Containers{ContainersGPU, ContainersAll}
	layoutPolicies          = []LayoutPolicy{LayoutPolicyMostGPUs, LayoutPolicyNewestDriver, LayoutPolicySpread}
	podSecurityActions      = []PodSecurity{PodSecurityWarn, PodSecurityDeny}
	legacyMountsActions     = []LegacyMounts{LegacyMountsReplace, LegacyMountsKeep}
	runtimeInjectionActions = []RuntimeInjection{RuntimeInjectionPin, RuntimeInjectionSkip}
	imageModes              = []ImagesMode{ImagesOff, ImagesOn}
	pullSecretsChoices      = []PullSecrets{PullSecretsRead, PullSecretsNone}
	deliveries              = []DriverDelivery{DeliveryPreferRuntime, DeliveryHostPath, DeliveryRuntime}
	noLayoutActions         = []NoLayoutAction{NoLayoutDeny, NoLayoutAllow, NoLayoutStatic}
)

// Enums are the fields of the file that take one of a few values, by their
// path ("[*]": every item of a list), each with every value the file may
// give it, "" too where the field may be left empty. Validate refuses any
// other value; JSONSchema lists these.
func Enums() map[string][]string {
	return map[string][]string{
		"apiVersion":                        defaulted([]string{APIVersion}),
		"kind":                              defaulted([]string{Kind}),
		"resources.renameToleration":        defaulted(renameTolerations),
		"ldLibraryPath":                     defaulted(ldLibraryPaths),
		"containers":                        defaulted(containerChoices),
		"layoutPolicy":                      defaulted(layoutPolicies),
		"podSecurity":                       defaulted(podSecurityActions),
		"legacyMounts":                      defaulted(legacyMountsActions),
		"runtimeInjection":                  defaulted(runtimeInjectionActions),
		"driverDelivery":                    defaulted(deliveries),
		"noLayout.action":                   defaulted(noLayoutActions),
		"images.mode":                       defaulted(imageModes),
		"images.pullSecrets":                defaulted(pullSecretsChoices),
		"staticLayouts[*].schemaVersion":    defaulted([]string{layout.SchemaVersion}),
		"staticLayouts[*].runtimeInjection": defaulted(layout.RuntimeInjections),
		"staticLayouts[*].mounts[*].kind":   {string(layout.KindDirectory), string(layout.KindFile)},
		"pinning.pools[*].taints[*].effect": {string(corev1.TaintEffectNoSchedule), string(corev1.TaintEffectNoExecute)},
	}
}

// defaulted is values as Enums lists them for a field that may be left
// empty: "" first.
func defaulted[T ~string](values []T) []string {
	out := []string{""}
	for _, v := range values {
		out = append(out, string(v))
	}
	return out
}

// Validate reports every bad field.
func (c *Configuration) Validate() field.ErrorList {
	var errs field.ErrorList
	if c.APIVersion != APIVersion {
		errs = append(errs, field.NotSupported(field.NewPath("apiVersion"), c.APIVersion, []string{APIVersion}))
	}
	if c.Kind != Kind {
		errs = append(errs, field.NotSupported(field.NewPath("kind"), c.Kind, []string{Kind}))
	}
	errs = append(errs, c.Resources.validate(field.NewPath("resources"))...)
	errs = append(errs, c.HostPaths.validate(field.NewPath("hostPaths"))...)
	errs = append(errs, c.ContainerPaths.validate(field.NewPath("containerPaths"))...)
	errs = append(errs, oneOf(field.NewPath("ldLibraryPath"), c.LDLibraryPath, ldLibraryPaths...)...)
	errs = append(errs, oneOf(field.NewPath("containers"), c.Containers, containerChoices...)...)
	errs = append(errs, oneOf(field.NewPath("layoutPolicy"), c.LayoutPolicy, layoutPolicies...)...)
	errs = append(errs, oneOf(field.NewPath("podSecurity"), c.PodSecurity, podSecurityActions...)...)
	errs = append(errs, oneOf(field.NewPath("legacyMounts"), c.LegacyMounts, legacyMountsActions...)...)
	errs = append(errs, oneOf(field.NewPath("runtimeInjection"), c.RuntimeInjection, runtimeInjectionActions...)...)
	errs = append(errs, oneOf(field.NewPath("driverDelivery"), c.DriverDelivery, deliveries...)...)
	errs = append(errs, c.validateLimits()...)
	errs = append(errs, c.validateImages()...)
	errs = append(errs, c.DRA.validate(field.NewPath("dra"))...)
	errs = append(errs, c.validateNoLayout(field.NewPath("noLayout"))...)
	errs = append(errs, c.validateStaticLayouts(field.NewPath("staticLayouts"))...)
	errs = append(errs, c.Pinning.validate(field.NewPath("pinning"))...)
	errs = append(errs, c.validateDeclaredPools(field.NewPath("pinning", "pools"))...)
	for i, ns := range c.ExcludedNamespaces {
		if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
			errs = append(errs, field.Invalid(field.NewPath("excludedNamespaces").Index(i), ns, strings.Join(msgs, "; ")))
		}
	}
	return errs
}

func (r Resources) validate(rp *field.Path) field.ErrorList {
	var errs field.ErrorList
	if len(r.Names) == 0 {
		errs = append(errs, field.Required(rp.Child("names"), "at least one GPU resource name"))
	}
	for i, n := range r.Names {
		if _, err := path.Match(n, ""); err != nil || n == "" || !strings.Contains(n, "/") {
			errs = append(errs, field.Invalid(rp.Child("names").Index(i), n, "must be a qualified extended resource name or path.Match pattern, like nvidia.com/gpu or nvidia.com/mig-*"))
		}
	}
	for i, n := range r.Legacy {
		if msgs := validation.IsQualifiedName(n); len(msgs) > 0 {
			errs = append(errs, field.Invalid(rp.Child("legacy").Index(i), n, strings.Join(msgs, "; ")))
		}
	}
	for i, n := range r.Legacy {
		if n == r.RenameTo {
			errs = append(errs, field.Invalid(rp.Child("legacy").Index(i), n, "must differ from renameTo"))
		}
	}
	if msgs := validation.IsQualifiedName(r.RenameTo); len(msgs) > 0 {
		errs = append(errs, field.Invalid(rp.Child("renameTo"), r.RenameTo, strings.Join(msgs, "; ")))
	}
	errs = append(errs, oneOf(rp.Child("renameToleration"), r.RenameToleration, renameTolerations...)...)
	if r.RenameToleration == RenameTolerationAdd && len(r.Legacy) > 0 && !IsExtendedResourceName(r.RenameTo) {
		// The admission plugin adds nothing for such a name either, so there
		// is nothing to stand in for.
		errs = append(errs, field.Invalid(rp.Child("renameToleration"), r.RenameToleration, fmt.Sprintf("renameTo %q is no extended resource name (a domain outside kubernetes.io, like nvidia.com/gpu), for which the ExtendedResourceToleration admission plugin adds no toleration; set renameToleration: %s", r.RenameTo, RenameTolerationNone)))
	}
	return errs
}

func (h HostPaths) validate(hp *field.Path) field.ErrorList {
	var errs field.ErrorList
	if len(h.Allowlist) == 0 {
		errs = append(errs, field.Required(hp.Child("allowlist"), "an empty allowlist would reject every layout"))
	}
	errs = append(errs, validateAllowlist(hp.Child("allowlist"), h.Allowlist)...)
	errs = append(errs, validateAllowlist(hp.Child("extraAllowlist"), h.ExtraAllowlist)...)
	for i, p := range h.DriverFilePatterns {
		if _, err := path.Match(p, ""); err != nil || p == "" || strings.Contains(p, "/") {
			errs = append(errs, field.Invalid(hp.Child("driverFilePatterns").Index(i), p, "must be a file name pattern without '/'"))
		}
	}
	return errs
}

func (cp ContainerPaths) validate(fp *field.Path) field.ErrorList {
	var errs field.ErrorList
	// In field order, so that the errors read the same on every start.
	for _, f := range []struct{ name, v string }{{"libraryDir", cp.LibraryDir}, {"binaryDir", cp.BinaryDir}} {
		if !path.IsAbs(f.v) || path.Clean(f.v) != f.v || f.v == "/" || strings.Contains(f.v, ":") {
			errs = append(errs, field.Invalid(fp.Child(f.name), f.v, "must be an absolute, clean path other than / without ':'"))
		}
	}
	return errs
}

func (d DRA) validate(dp *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, n := range d.DeviceClasses {
		// A class name is a DNS subdomain; a pattern may hold * ? [ as well.
		plain := strings.NewReplacer("*", "x", "?", "x", "[", "x", "]", "x").Replace(n)
		if _, err := path.Match(n, ""); err != nil || len(validation.IsDNS1123Subdomain(plain)) > 0 {
			errs = append(errs, field.Invalid(dp.Child("deviceClasses").Index(i), n, "must be a DeviceClass name or path.Match pattern, like gpu.nvidia.com or *.gpu.nvidia.com"))
		}
	}
	for i, n := range d.Drivers {
		if msgs := validation.IsDNS1123Subdomain(n); len(msgs) > 0 {
			errs = append(errs, field.Invalid(dp.Child("drivers").Index(i), n, strings.Join(msgs, "; ")))
		}
	}
	return errs
}

// validateNoLayout checks noLayout, whose static layout must be one of
// staticLayouts.
func (c *Configuration) validateNoLayout(np *field.Path) field.ErrorList {
	errs := oneOf(np.Child("action"), c.NoLayout.Action, noLayoutActions...)
	if c.NoLayout.Action == NoLayoutStatic {
		if c.NoLayout.StaticLayout == "" {
			errs = append(errs, field.Required(np.Child("staticLayout"), "the name of a staticLayouts entry, with action Static"))
		} else if _, ok := c.Static(c.NoLayout.StaticLayout); !ok {
			errs = append(errs, field.NotFound(np.Child("staticLayout"), c.NoLayout.StaticLayout))
		}
	} else if c.NoLayout.StaticLayout != "" {
		errs = append(errs, field.Invalid(np.Child("staticLayout"), c.NoLayout.StaticLayout, "only used with action Static"))
	}
	return errs
}

// validateStaticLayouts checks each static layout's name and node selector,
// and its plan by the rules a probed layout meets.
func (c *Configuration) validateStaticLayouts(fp *field.Path) field.ErrorList {
	var errs field.ErrorList
	names := map[string]bool{}
	for i, s := range c.StaticLayouts {
		sp := fp.Index(i)
		if msgs := validation.IsDNS1123Label(s.Name); len(msgs) > 0 {
			errs = append(errs, field.Invalid(sp.Child("name"), s.Name, strings.Join(msgs, "; ")))
		}
		if names[s.Name] {
			errs = append(errs, field.Duplicate(sp.Child("name"), s.Name))
		}
		names[s.Name] = true
		for _, e := range s.Plan.Validate(c.Rules()) {
			e.Field = sp.String() + strings.TrimPrefix(e.Field, "layout")
			errs = append(errs, e)
		}
		for k, v := range s.NodeSelector {
			if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
				errs = append(errs, field.Invalid(sp.Child("nodeSelector").Key(k), k, strings.Join(msgs, "; ")))
			}
			if msgs := validation.IsValidLabelValue(v); len(msgs) > 0 {
				errs = append(errs, field.Invalid(sp.Child("nodeSelector").Key(k), v, strings.Join(msgs, "; ")))
			}
		}
	}
	return errs
}

// validateAllowlist applies one set of rules to allowlist and extraAllowlist
// entries: an added folder is trusted exactly as a default one is.
func validateAllowlist(fp *field.Path, entries []layout.AllowedPath) field.ErrorList {
	var errs field.ErrorList
	for i, a := range entries {
		ip := fp.Index(i).Child("path")
		if !path.IsAbs(a.Path) || path.Clean(a.Path) != a.Path || a.Path == "/" {
			errs = append(errs, field.Invalid(ip, a.Path, "must be an absolute, clean path other than /"))
		} else if _, err := path.Match(a.Path, "/"); err != nil {
			errs = append(errs, field.Invalid(ip, a.Path, fmt.Sprintf("bad pattern: %v", err)))
		} else if s := sensitiveOverlap(a.Path); s != "" && !a.FilesOnly {
			errs = append(errs, field.Forbidden(ip, fmt.Sprintf("it would allow the system folder %s whole; allow it only with filesOnly: true, or name the driver's own folder", s)))
		}
	}
	return errs
}

func (p Pinning) validate(fp *field.Path) field.ErrorList {
	var errs field.ErrorList
	if len(p.NodeLabels) > MaxPinningLabels {
		errs = append(errs, field.TooMany(fp.Child("nodeLabels"), len(p.NodeLabels), MaxPinningLabels))
	}
	seen := map[string]bool{}
	for i, k := range p.NodeLabels {
		ip := fp.Child("nodeLabels").Index(i)
		switch {
		case len(validation.IsQualifiedName(k)) > 0:
			errs = append(errs, field.Invalid(ip, k, strings.Join(validation.IsQualifiedName(k), "; ")))
		case strings.HasPrefix(k, layout.Prefix):
			// The probe sets these after a node joined: no autoscaler can
			// know them for a node it has yet to create.
			errs = append(errs, field.Forbidden(ip, fmt.Sprintf("%s labels are set by the probe, which no autoscaler knows; name a label the autoscaler puts on new nodes, such as karpenter.sh/nodepool", layout.Prefix)))
		case seen[k]:
			errs = append(errs, field.Duplicate(ip, k))
		}
		seen[k] = true
	}
	if p.RememberFor != nil && p.RememberFor.Duration < 0 {
		errs = append(errs, field.Invalid(fp.Child("rememberFor"), p.RememberFor.Duration.String(), "must not be negative; 0s forgets a pool as soon as its last node leaves"))
	}
	return errs
}

// validateDeclaredPools checks each declared pool as the webhook will read
// it, so that a pool it would skip is refused here, with the reason.
func (c *Configuration) validateDeclaredPools(fp *field.Path) field.ErrorList {
	var errs field.ErrorList
	ps := c.Pinning.Pools
	if len(ps) == 0 {
		return nil
	}
	if !c.Pinning.ByPool() {
		return append(errs, field.Forbidden(fp, "declared pools need pinning.nodeLabels, the labels that name a pool"))
	}
	if len(ps) > pools.MaxDeclared {
		return append(errs, field.TooMany(fp, len(ps), pools.MaxDeclared))
	}
	seen := map[string]bool{}
	for i, p := range ps {
		bad := false
		for j, t := range p.Taints {
			if t.Effect != string(corev1.TaintEffectNoSchedule) && t.Effect != string(corev1.TaintEffectNoExecute) {
				errs = append(errs, field.NotSupported(fp.Index(i).Child("taints").Index(j).Child("effect"), t.Effect, []corev1.TaintEffect{corev1.TaintEffectNoSchedule, corev1.TaintEffectNoExecute}))
				bad = true
			}
		}
		if bad {
			continue
		}
		m, err := pools.Declared(p.Pool, p.NodeLabels, p.TaintList(), p.Layout, c.Pinning.NodeLabels, c.Rules())
		switch {
		case err != nil:
			errs = append(errs, field.Invalid(fp.Index(i), m.Pool, err.Error()))
		case seen[m.Pool]:
			errs = append(errs, field.Duplicate(fp.Index(i).Child("pool"), m.Pool))
		}
		seen[m.Pool] = true
	}
	return errs
}

// DeclaredPools are the pools the configuration declares, as the webhook
// serves them; a declaration that does not hold (Validate refuses it) is
// left out.
func (c *Configuration) DeclaredPools() []pools.Memory {
	var out []pools.Memory
	for i, p := range c.Pinning.Pools {
		if i == pools.MaxDeclared {
			break
		}
		if m, err := pools.Declared(p.Pool, p.NodeLabels, p.TaintList(), p.Layout, c.Pinning.NodeLabels, c.Rules()); err == nil {
			out = append(out, m)
		}
	}
	return out
}

// IsExtendedResourceName reports whether name is an extended resource, as
// the API server decides it: a name with a domain outside kubernetes.io, not
// a quota's "requests." name, that is a qualified name with that prefix too.
// Only extended resources get a toleration from the ExtendedResourceToleration
// admission plugin.
func IsExtendedResourceName(name string) bool {
	if !strings.Contains(name, "/") || strings.Contains(name, "kubernetes.io/") || strings.HasPrefix(name, "requests.") {
		return false
	}
	return len(validation.IsQualifiedName("requests."+name)) == 0
}

// sensitiveFolders must never be mounted whole: the host's system, its
// secrets, and the kubelet's and runtimes' state.
var sensitiveFolders = []string{
	"/etc", "/usr", "/usr/lib", "/usr/lib64", "/usr/bin", "/usr/sbin", "/usr/lib/x86_64-linux-gnu",
	"/usr/lib/aarch64-linux-gnu", "/lib", "/lib64", "/bin", "/sbin", "/var", "/root", "/home", "/proc",
	"/sys", "/dev", "/run", "/boot", "/var/lib/kubelet", "/var/lib/containerd", "/run/containerd",
	"/var/run", "/etc/kubernetes", "/var/log", "/opt", "/srv", "/tmp",
}

// IsSystemFolder reports whether p is one of the folders that must never be
// mounted whole, whatever the allowlist says.
func IsSystemFolder(p string) bool {
	for _, s := range sensitiveFolders {
		if p == s {
			return true
		}
	}
	return false
}

// sensitiveOverlap returns a sensitive folder that an allowlist entry (a path
// whose last element may be a pattern) matches, lies above, or lies inside
// /etc, /proc, /sys, /dev, /root or the kubelet's state.
func sensitiveOverlap(entry string) string {
	for _, s := range sensitiveFolders {
		if ok, _ := path.Match(entry, s); ok || entry == s || strings.HasPrefix(s, entry+"/") {
			return s
		}
		// A pattern in the last element may match an ancestor of s.
		for q := path.Dir(s); q != "/"; q = path.Dir(q) {
			if ok, _ := path.Match(entry, q); ok {
				return s
			}
		}
	}
	for _, s := range []string{"/etc", "/proc", "/sys", "/dev", "/root", "/var/lib/kubelet", "/run/containerd", "/var/lib/containerd"} {
		if strings.HasPrefix(entry, s+"/") {
			return s
		}
	}
	return ""
}

func oneOf[T ~string](p *field.Path, v T, allowed ...T) field.ErrorList {
	if slices.Contains(allowed, v) {
		return nil
	}
	return field.ErrorList{field.NotSupported(p, string(v), allowed)}
}

func (c *Configuration) validateLimits() field.ErrorList {
	var errs field.ErrorList
	rp, lp := field.NewPath("ranking"), field.NewPath("limits")
	for _, f := range []struct {
		path *field.Path
		v    int64
	}{
		{rp.Child("maxGPUsPerNode"), c.Ranking.MaxGPUsPerNode},
		{rp.Child("minNodes"), int64(c.Ranking.MinNodes)},
		{lp.Child("maxGPUContainers"), int64(c.Limits.MaxGPUContainers)},
		{lp.Child("maxPatchOperations"), int64(c.Limits.MaxPatchOperations)},
		{lp.Child("maxPatchBytes"), int64(c.Limits.MaxPatchBytes)},
	} {
		if f.v < 1 {
			errs = append(errs, field.Invalid(f.path, f.v, "must be at least 1"))
		}
	}
	return errs
}

// maxImageBudget keeps a read well inside the API server's 30 s ceiling on
// a webhook's timeoutSeconds; the chart's default timeout is 5 s.
const maxImageBudget = 10 * time.Second

// MaxCredentialProviderTimeout leaves a read, which gives up after 30 s,
// time for the registry once the plugin answered.
const MaxCredentialProviderTimeout = 20 * time.Second

func (c *Configuration) validateImages() field.ErrorList {
	var errs field.ErrorList
	ip := field.NewPath("images")
	im := &c.Images
	errs = append(errs, oneOf(ip.Child("mode"), im.Mode, imageModes...)...)
	errs = append(errs, oneOf(ip.Child("pullSecrets"), im.PullSecrets, pullSecretsChoices...)...)
	for _, f := range []struct {
		name string
		v    []string
	}{{"registries", im.Registries}, {"insecureRegistries", im.InsecureRegistries}} {
		for i, r := range f.v {
			if r == "" || strings.ContainsAny(r, "/@ \t") || strings.Contains(r, "://") {
				errs = append(errs, field.Invalid(ip.Child(f.name).Index(i), r, "must be a registry host or host:port, like registry.example.com or localhost:5000"))
			}
		}
	}
	for i, r := range im.InsecureRegistries {
		if !slices.Contains(im.Registries, r) {
			errs = append(errs, field.Invalid(ip.Child("insecureRegistries").Index(i), r, "must also be listed in registries"))
		}
	}
	for i, n := range im.Namespaces {
		if msgs := validation.IsDNS1123Label(n); len(msgs) > 0 {
			errs = append(errs, field.Invalid(ip.Child("namespaces").Index(i), n, strings.Join(msgs, "; ")))
		}
	}
	if im.TagTTL != nil && im.TagTTL.Duration < 0 {
		errs = append(errs, field.Invalid(ip.Child("tagTTL"), im.TagTTL.Duration.String(), "must not be negative; 0s reads a tag's digest on every admission"))
	}
	if im.Budget != nil && (im.Budget.Duration <= 0 || im.Budget.Duration > maxImageBudget) {
		errs = append(errs, field.Invalid(ip.Child("budget"), im.Budget.Duration.String(), fmt.Sprintf("must be above 0s and at most %s, and well inside the webhook's timeoutSeconds", maxImageBudget)))
	}
	if im.MaxEntries < 1 {
		errs = append(errs, field.Invalid(ip.Child("maxEntries"), im.MaxEntries, "must be at least 1"))
	}
	if im.MaxBytes < 1 {
		errs = append(errs, field.Invalid(ip.Child("maxBytes"), im.MaxBytes, "must be at least 1"))
	}
	return append(errs, validateCredentialProviders(ip.Child("credentialProviders"), im.CredentialProviders)...)
}

func validateCredentialProviders(p *field.Path, cp CredentialProviders) field.ErrorList {
	var errs field.ErrorList
	if !cp.Enabled() {
		if cp.BinDir != "" || cp.Timeout != nil {
			errs = append(errs, field.Required(p.Child("config"), "the CredentialProviderConfig file, with binDir or timeout set"))
		}
		return errs
	}
	for _, f := range []struct{ name, v string }{{"config", cp.Config}, {"binDir", cp.BinDir}} {
		switch {
		case !path.IsAbs(f.v) || path.Clean(f.v) != f.v:
			errs = append(errs, field.Invalid(p.Child(f.name), f.v, "must be an absolute, clean path in the webhook's container"))
		case f.v == "/":
			// The chart mounts the node's path at the same path.
			errs = append(errs, field.Invalid(p.Child(f.name), f.v, "must not be the root, which the chart would mount over the webhook's own"))
		}
	}
	if cp.Timeout != nil && (cp.Timeout.Duration <= 0 || cp.Timeout.Duration > MaxCredentialProviderTimeout) {
		errs = append(errs, field.Invalid(p.Child("timeout"), cp.Timeout.Duration.String(), fmt.Sprintf("must be above 0s and at most %s", MaxCredentialProviderTimeout)))
	}
	return errs
}
