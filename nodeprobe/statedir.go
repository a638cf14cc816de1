package nodeprobe

import (
	"context"
	"errors"
	"time"

	"github.com/go-logr/logr"

	"github.com/gpu-injector/gpu-injector/layout"
	"github.com/gpu-injector/gpu-injector/layout/statedir"
)

// pluginPoll is how often the probe looks at the NRI plugin's file: a stat
// and a read of a few hundred bytes, so the label follows the plugin within
// seconds.
const pluginPoll = 2 * time.Second

// writeState tells the NRI plugin beside the probe the node's current plan,
// or that there is none, so a marked container never gets the mounts of a
// driver the node no longer has. Without --state-dir it does nothing.
func (d *daemon) writeState(log logr.Logger, res *Result, probeErr error) {
	dir := d.opts.StateDir
	if dir == "" {
		return
	}
	var err error
	switch {
	case probeErr != nil:
		// ErrNVMLReload: the driver changed and the probe restarts to load
		// it; until it has probed, the old plan is not to be used.
		err = statedir.WriteLayout(dir, nil, statedir.NoLayout{State: layout.StateError, Reason: probeErr.Error()})
	case res.Ready():
		err = statedir.WriteLayout(dir, res.Plan, statedir.NoLayout{})
	default:
		pub, derr := Desired(*res)
		state := layout.StateError
		if derr == nil {
			state = pub.Labels[layout.LabelState]
		}
		err = statedir.WriteLayout(dir, nil, statedir.NoLayout{State: state, Reason: res.Reason()})
	}
	if err != nil {
		log.Error(err, "failed to write the layout for the nri plugin", "stateDir", dir)
	}
}

// pluginRegistered reads the NRI plugin's file: true while the plugin says
// the runtime has it registered, with a fresh heartbeat.
func (d *daemon) pluginRegistered(log logr.Logger) bool {
	if d.opts.StateDir == "" {
		return false
	}
	p, err := statedir.ReadPlugin(d.opts.StateDir)
	if err != nil {
		log.Error(err, "failed to read the nri plugin's state", "stateDir", d.opts.StateDir)
		return false
	}
	up := p.Registered(d.now())
	d.noteStaleDriver(log, p, up)
	return up
}

// watchPlugin polls the plugin's file and asks the loop to republish when
// what it says changes.
func (d *daemon) watchPlugin(ctx context.Context, log logr.Logger) {
	poll := d.pluginPoll
	if poll <= 0 {
		poll = pluginPoll
	}
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		staleBefore := d.staleDriverValue()
		up := d.pluginRegistered(log)
		if d.pluginUp.Swap(up) != up || d.staleDriverValue() != staleBefore {
			log.Info("nri plugin registration changed: republishing", "registered", up)
			select {
			case d.relabel <- struct{}{}:
			default:
			}
		}
	}
}

// withPlugin sets layout.LabelNRIPlugin on p while the plugin is registered,
// and leaves it off otherwise (Publish then removes it).
func (d *daemon) withPlugin(p Published) Published {
	if !d.pluginUp.Load() {
		return p
	}
	return d.withStaleDriver(p.withLabel(layout.LabelNRIPlugin, layout.NRIProtocol))
}

// dropPluginLabel removes the label as the probe stops: the plugin beside
// it stops with it, and until a new probe starts and looks, new pods
// would be sent to a node that no longer injects their driver.
func (d *daemon) dropPluginLabel(log logr.Logger) {
	if !d.pluginUp.Swap(false) {
		return
	}
	// The run's context is done; the pod's grace period is not.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := d.republish(ctx, log); err != nil && !errors.Is(err, ErrConditionForbidden) {
		log.Error(err, "failed to remove the nri plugin label on the way out")
	}
}

// republish writes the last probe's result again with the plugin's label as
// it is now, without probing: the plugin coming or going changes nothing
// else, and a probe may take the whole NVML limit on a wedged driver.
func (d *daemon) republish(ctx context.Context, log logr.Logger) error {
	if d.lastPub == nil {
		// The first probe publishes the label with everything else.
		return nil
	}
	pub := d.withMounts(d.withPlugin(*d.lastPub))
	wrote, err := Publish(ctx, d.client, d.opts.NodeName, pub)
	if wrote {
		d.metrics.writes.Inc()
		log.Info("published the nri plugin label", "registered", d.pluginUp.Load())
	}
	return err
}
