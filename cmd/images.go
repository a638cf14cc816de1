package cmd

import (
	"flag"

	"github.com/gpu-injector/gpu-injector/config"
	"github.com/gpu-injector/gpu-injector/webhook/admitinput"
	"github.com/gpu-injector/gpu-injector/webhook/admitinput/offline"
)

// imageFlags say where the offline commands read the images' configuration.
type imageFlags struct {
	files []string
	pull  bool
}

func (f *imageFlags) register(fs *flag.FlagSet) {
	fs.Var((*stringList)(&f.files), "images", "the `path` of an OCI layout folder, or of a tarball as docker save writes it, holding images the pods run: read as the webhook reads their registry (images.mode On); repeatable")
	fs.BoolVar(&f.pull, "pull", false, "read the images' configuration from their registries (those of images.registries, or any when it lists none), with your docker credentials")
}

func (f *imageFlags) given() bool { return f.pull || len(f.files) > 0 }

// reader is the images' reader the flags say; nil for none.
func (f *imageFlags) reader(cfg *config.Configuration) (admitinput.ImageReader, error) {
	switch {
	case len(f.files) > 0:
		local, err := offline.ReadLocalImages(f.files)
		if err != nil {
			return nil, err
		}
		return local, nil
	case f.pull:
		return offline.NewPulledImages(&cfg.Images), nil
	}
	return nil, nil
}
