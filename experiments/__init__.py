"""Your own components: classes here may be targets of configs (`_target_: experiments.my_idea.MyModel`)."""
